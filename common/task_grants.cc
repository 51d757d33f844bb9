#include "common/task_grants.h"

#include <grp.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace weft {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxGrantEntries = 64;
constexpr size_t kMaxGrantLength = 256;
const char* const kHostNamespaces[] = {"pid", "ipc", "uts", "mount"};

bool is_number(const std::string& s) {
  return !s.empty() && s.size() <= 10 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A plain absolute path: no "." or ".." component, no doubled or trailing slash.
bool plain_absolute(const std::string& p) {
  if (p.empty() || p[0] != '/' || p.size() > 4096) return false;
  if (p == "/") return true;
  if (p.back() == '/') return false;
  size_t i = 1;
  while (i <= p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    std::string part = p.substr(i, j - i);
    if (part.empty() || part == "." || part == "..") return false;
    i = j + 1;
  }
  return p.find('\0') == std::string::npos;
}

// `path` is `dir` or under it (both plain and absolute).
bool under(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

Result<std::vector<std::string>> names(const json& j, const std::string& field) {
  if (!j.is_array() || j.size() > kMaxGrantEntries)
    return field_error(field, "must be a list of at most 64 strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string f = field + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) return field_error(f, "must be a string");
    std::string s = j[i].get<std::string>();
    if (s.empty() || s.size() > kMaxGrantLength ||
        s.find_first_of(std::string("\n\r\t :/\0", 8)) != std::string::npos)
      return field_error(f, "must be a user or group name or number (no spaces, ':' or '/')");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

bool never_grantable_user(const std::string& user) {
  if (user == "root") return true;
  return is_number(user) && std::stoull(user) == 0;
}

std::optional<unsigned long> group_number(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::optional<unsigned long>> known;
  std::lock_guard lock(mu);
  if (auto it = known.find(name); it != known.end()) return it->second;
  std::optional<unsigned long> gid;
  struct group g {};
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found) == 0 && found)
    gid = static_cast<unsigned long>(found->gr_gid);
  if (known.size() < 64) known[name] = gid;
  return gid;
}

bool never_grantable_group(const std::string& group, const std::string& socket_group) {
  if (never_grantable_user(group) || group == socket_group) return true;
  if (!is_number(group)) return false;
  // Its number on this host too (the same package makes the same group on every machine
  // of a fleet, though not always with the same number: the agent checks its own).
  auto gid = group_number(socket_group);
  return gid && std::stoull(group) == *gid;
}

Result<TaskGrants> parse_task_grants(const json& j, const std::string& socket_group) {
  if (!j.is_object()) return field_error("grants", "must be an object");
  TaskGrants g;
  for (const auto& [key, v] : j.items()) {
    std::string field = "grants." + key;
    if (key == "privileged") {
      if (!v.is_boolean()) return field_error(field, "must be true or false");
      g.privileged = v.get<bool>();
    } else if (key == "seccomp_unconfined") {
      if (!v.is_boolean()) return field_error(field, "must be true or false");
      g.seccomp_unconfined = v.get<bool>();
    } else if (key == "host_network") {
      if (!v.is_boolean()) return field_error(field, "must be true or false");
      g.host_network = v.get<bool>();
    } else if (key == "low_ports") {
      if (!v.is_boolean()) return field_error(field, "must be true or false");
      g.low_ports = v.get<bool>();
    } else if (key == "users") {
      TRY_ASSIGN(g.users, names(v, field));
      for (size_t i = 0; i < g.users.size(); ++i)
        if (never_grantable_user(g.users[i]))
          return field_error(field + "[" + std::to_string(i) + "]",
                             "root is never granted to a job's tasks");
    } else if (key == "groups") {
      TRY_ASSIGN(g.groups, names(v, field));
      for (size_t i = 0; i < g.groups.size(); ++i)
        if (never_grantable_group(g.groups[i], socket_group))
          return field_error(field + "[" + std::to_string(i) + "]",
                             "'" + g.groups[i] +
                                 "' is never granted to a job's tasks (root, or the group of "
                                 "weft's local sockets: an admin of every daemon)");
    } else if (key == "host_namespaces") {
      TRY_ASSIGN(auto ns, names(v, field));
      for (size_t i = 0; i < ns.size(); ++i) {
        if (std::find(std::begin(kHostNamespaces), std::end(kHostNamespaces), ns[i]) ==
            std::end(kHostNamespaces))
          return field_error(field + "[" + std::to_string(i) + "]",
                             "must be pid, ipc, uts or mount");
        g.host_namespaces.insert(ns[i]);
      }
    } else if (key == "host_paths") {
      if (!v.is_array() || v.size() > kMaxGrantEntries)
        return field_error(field, "must be a list of at most 64 absolute paths");
      for (size_t i = 0; i < v.size(); ++i) {
        std::string f = field + "[" + std::to_string(i) + "]";
        if (!v[i].is_string() || !plain_absolute(v[i].get<std::string>()))
          return field_error(f, "must be an absolute path without '.', '..' or a trailing '/'");
        g.host_paths.push_back(v[i].get<std::string>());
      }
    } else {
      return field_error(field,
                         "unknown grant (privileged, users, groups, host_namespaces, host_paths, "
                         "seccomp_unconfined, host_network, low_ports)");
    }
  }
  return g;
}

json to_json(const TaskGrants& g) {
  json j = json::object();
  if (g.privileged) j["privileged"] = true;
  if (!g.users.empty()) j["users"] = g.users;
  if (!g.groups.empty()) j["groups"] = g.groups;
  if (!g.host_namespaces.empty()) j["host_namespaces"] = g.host_namespaces;
  if (!g.host_paths.empty()) j["host_paths"] = g.host_paths;
  if (g.seccomp_unconfined) j["seccomp_unconfined"] = true;
  if (g.host_network) j["host_network"] = true;
  if (g.low_ports) j["low_ports"] = true;
  return j;
}

Status check_task_grants(const TaskSpec& s, const TaskGrants& g, const std::string& entitlement,
                         const std::string& socket_group, const std::string& prefix) {
  if (!s.user.empty() && never_grantable_user(s.user))
    return field_error(prefix + "user", "a job's tasks never run as root");
  if (!s.group.empty() && never_grantable_group(s.group, socket_group))
    return field_error(prefix + "group", "a job's tasks never run with group '" + s.group +
                                             "' (root, or the group of weft's local sockets)");
  if (g.privileged) return {};
  auto refuse = [&](const std::string& field, const std::string& what, const std::string& how) {
    return field_error(field, "asks for " + what + ", which entitlement " + entitlement +
                                  " does not grant (an admin grants it: " + how +
                                  "; docs/security.md)");
  };
  auto listed = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  if (!s.user.empty() && !listed(g.users, s.user))
    return refuse(prefix + "user", "user " + s.user,
                  "grants.users; without \"user\" a task runs as a uid of its own");
  if (!s.group.empty() && !listed(g.groups, s.group))
    return refuse(prefix + "group", "group " + s.group, "grants.groups");
  for (auto [name, on] :
       {std::pair{"pid", s.ns.pid}, {"ipc", s.ns.ipc}, {"uts", s.ns.uts}, {"mount", s.ns.mount}})
    if (!on && !g.host_namespaces.count(name))
      return refuse(prefix + "namespaces." + name, std::string("the host's ") + name + " namespace",
                    "grants.host_namespaces");
  auto path_granted = [&](const std::string& p) {
    if (!plain_absolute(p)) return false;
    return std::any_of(g.host_paths.begin(), g.host_paths.end(),
                       [&](const std::string& d) { return under(p, d); });
  };
  for (size_t i = 0; i < s.mounts.size(); ++i)
    if (s.mounts[i].kind == MountKind::kBind && !path_granted(s.mounts[i].source))
      return refuse(prefix + "mounts[" + std::to_string(i) + "].source",
                    "host path " + s.mounts[i].source, "grants.host_paths");
  if (!s.rootfs.empty() && !path_granted(s.rootfs))
    return refuse(prefix + "rootfs", "host path " + s.rootfs + " as its root", "grants.host_paths");
  if (s.seccomp_unconfined && !g.seccomp_unconfined)
    return refuse(prefix + "seccomp", "no seccomp filter", "grants.seccomp_unconfined");
  if (s.ns.network == NetworkMode::kHost && !g.host_network)
    return refuse(prefix + "namespaces.network",
                  "the host's network (every port of the machine, and what it serves on "
                  "loopback)",
                  "grants.host_network, weftctl entitlement grant --host-network; without "
                  "namespaces.network a job's task gets a network of its own");
  return check_port_grants(s.ports, g, entitlement, prefix + "ports.");
}

Status check_port_grants(const std::map<std::string, uint16_t>& ports, const TaskGrants& g,
                         const std::string& entitlement, const std::string& prefix) {
  if (g.privileged || g.low_ports) return {};
  for (const auto& [name, port] : ports)
    if (port != 0 && port < 1024)
      return field_error(prefix + name,
                         "port " + std::to_string(port) + " is below 1024, which entitlement " +
                             entitlement +
                             " does not grant (an admin grants it: grants.low_ports, weftctl "
                             "entitlement grant --low-ports; docs/security.md)");
  return {};
}

}  // namespace weft
