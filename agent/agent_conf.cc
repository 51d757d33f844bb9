#include "agent/agent_conf.h"

#include "common/cp_link.h"

#include <arpa/inet.h>
#include <linux/magic.h>
#include <net/if.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "common/config.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/rpc/endpoint.h"
#include "common/services.h"
#include "common/units.h"

#ifndef WEFT_LIBEXECDIR
#define WEFT_LIBEXECDIR "/usr/libexec/weft"
#endif

namespace weft::agent {

namespace {

// "FIRST-LAST" (task_uids, port_range): both numbers, or -1 for one that is not there.
std::pair<long, long> parse_range(const std::string& text) {
  auto dash = text.find('-');
  char* end = nullptr;
  long first = -1, last = -1;
  if (dash != std::string::npos && dash > 0) {
    first = std::strtol(text.c_str(), &end, 10);
    if (end != text.c_str() + dash) first = -1;
    last = std::strtol(text.c_str() + dash + 1, &end, 10);
    if (*end != '\0' || dash + 1 == text.size()) last = -1;
  }
  return {first, last};
}

// [bridge]: name, subnet ("A.B.C.D/N", IPv4, 8 <= N <= 28), host_ports.
Status parse_bridge(const TomlDoc& doc, const toml::table& b, AgentConfig* c) {
  TRY(doc.only_keys(b, "bridge.", {"name", "subnet", "host_ports"}));
  auto where = [&](const char* key) { return doc.where(*b.get(key)); };
  TRY_ASSIGN(auto name, doc.get_string(b, "name"));
  c->bridge = name.value_or("weft0");
  bool name_ok = !c->bridge.empty() && c->bridge.size() < IFNAMSIZ && c->bridge != "lo" &&
                 std::isalpha(static_cast<unsigned char>(c->bridge[0]));
  for (char ch : c->bridge)
    name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_');
  if (!name_ok)
    return field_error(b.get("name") ? where("name") : doc.where(b),
                       "'bridge.name' must be an interface name: 1-15 letters, digits, '-' and "
                       "'_', starting with a letter (such as \"weft0\")");
  TRY_ASSIGN(auto subnet, doc.get_string(b, "subnet"));
  std::string text = subnet.value_or("10.89.0.0/16");
  auto slash = text.find('/');
  in_addr addr{};
  char* end = nullptr;
  long prefix = slash == std::string::npos ? -1 : std::strtol(text.c_str() + slash + 1, &end, 10);
  bool subnet_ok = slash != std::string::npos && end && *end == '\0' && slash + 1 < text.size() &&
                   prefix >= 8 && prefix <= 28 &&
                   ::inet_pton(AF_INET, text.substr(0, slash).c_str(), &addr) == 1;
  uint32_t net = ntohl(addr.s_addr);
  uint32_t mask = subnet_ok ? ~uint32_t{0} << (32 - prefix) : 0;
  if (!subnet_ok || (net & ~mask) != 0)
    return field_error(subnet ? where("subnet") : doc.where(b),
                       "'bridge.subnet' must be an IPv4 network \"A.B.C.D/N\" with 8 <= N <= 28 "
                       "and no host bits, such as \"10.89.0.0/16\"");
  c->bridge_net = net;
  c->bridge_prefix = static_cast<int>(prefix);
  if (const toml::node* ports = b.get("host_ports")) {
    const toml::array* list = ports->as_array();
    bool ok = list != nullptr;
    for (size_t i = 0; ok && i < list->size(); ++i) {
      auto v = (*list)[i].value<int64_t>();
      ok = v && *v >= 1 && *v <= 65535 && (*list)[i].is_integer();
      if (ok) c->bridge_host_ports.push_back(static_cast<uint16_t>(*v));
    }
    if (!ok)
      return field_error(where("host_ports"),
                         "'bridge.host_ports' must be a list of ports (1-65535), such as [8600]");
  }
  return {};
}

}  // namespace

Result<AgentConfig> parse_agent_config(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(t, "",
                    {"socket",
                     "socket_group",
                     "state_dir",
                     "cgroup_root",
                     "machine_id",
                     "labels",
                     "control_plane",
                     "insecure_control_plane",
                     "init_path",
                     "host_root",
                     "log_level",
                     "default_task_user",
                     "allow_root_tasks",
                     "allow_unconfined_tasks",
                     "log_journald",
                     "journald_socket",
                     "metrics_listen",
                     "netns_pool",
                     "sandbox_pool",
                     "images",
                     "volumes",
                     "task_uids",
                     "port_range",
                     "dns_listen",
                     "dns_ttl",
                     "dns_services",
                     "usage_interval",
                     "reserved_ports",
                     "advertise_address",
                     "bridge"},
                    kControlPlaneTlsKeys));
  AgentConfig c;
  TRY(doc.read_strings(t, {{"socket", &c.socket},
                           {"socket_group", &c.socket_group},
                           {"state_dir", &c.state_dir},
                           {"cgroup_root", &c.cgroup_root},
                           {"machine_id", &c.machine_id},
                           {"control_plane", &c.control_plane},
                           {"init_path", &c.init_path},
                           {"host_root", &c.host_root},
                           {"log_level", &c.log_level}}));
  TRY_ASSIGN(auto default_user, doc.get_string(t, "default_task_user"));
  c.default_task_user = default_user;
  TRY_ASSIGN(auto uids, doc.get_string(t, "task_uids"));
  if (uids) {
    // "FIRST-LAST", both above the ids of every user and group the host has.
    auto where = doc.where(*t.get("task_uids"));
    auto [first, last] = parse_range(*uids);
    if (first < 65536 || last < first || last > 2000000000L)
      return field_error(where,
                         "'task_uids' must be \"FIRST-LAST\" with 65536 <= FIRST <= LAST <= "
                         "2000000000 (uids no host user has)");
    c.task_uid_first = first;
    c.task_uid_last = last;
  }
  TRY_ASSIGN(auto ports, doc.get_string(t, "port_range"));
  if (ports) {
    auto where = doc.where(*t.get("port_range"));
    auto [first, last] = parse_range(*ports);
    if (first < 1024 || last < first || last > 65535)
      return field_error(where,
                         "'port_range' must be \"FIRST-LAST\" with 1024 <= FIRST <= LAST "
                         "<= 65535, such as \"20000-32767\"");
    c.port_first = static_cast<uint16_t>(first);
    c.port_last = static_cast<uint16_t>(last);
  }
  if (const toml::node* reserved = t.get("reserved_ports")) {
    // Ports (22) and ranges ("2379-2380").
    const toml::array* list = reserved->as_array();
    bool ok = list != nullptr && list->size() <= 1024;
    for (size_t i = 0; ok && i < list->size(); ++i) {
      int64_t first = -1, last = -1;
      if (auto v = (*list)[i].value<int64_t>(); v && (*list)[i].is_integer()) {
        first = last = *v;
      } else if (auto s = (*list)[i].value<std::string>()) {
        auto [a, b] = parse_range(*s);
        first = a;
        last = b;
      }
      ok = first >= 1 && last >= first && last <= 65535;
      for (int64_t p = first; ok && p <= last; ++p)
        c.reserved_ports.insert(static_cast<uint16_t>(p));
    }
    if (!ok)
      return field_error(doc.where(*reserved),
                         "'reserved_ports' must be a list of ports (1-65535) and \"FIRST-LAST\" "
                         "ranges, such as [22, \"2379-2380\"]");
  }
  TRY(doc.read_strings(t, {{"dns_listen", &c.dns_listen}}));
  if (!c.dns_listen.empty()) {
    auto ep = rpc::parse_endpoint(c.dns_listen);
    if (!ep.ok() || ep->is_unix || ep->port == 0)
      return field_error(doc.where(*t.get("dns_listen")),
                         "'dns_listen' must be \"host:port\" (UDP), such as \"127.0.0.1:8600\"");
  }
  TRY_ASSIGN(auto ttl, doc.get_string(t, "dns_ttl"));
  if (ttl) {
    auto us = parse_duration_us(*ttl);
    if (!us.ok() || *us > 3600'000'000ull)
      return field_error(doc.where(*t.get("dns_ttl")),
                         "'dns_ttl' must be a duration of at most 1h, such as \"1s\"");
    c.dns_ttl_s = static_cast<uint32_t>(*us / 1'000'000);
  }
  TRY_ASSIGN(auto dns_services, doc.get_string(t, "dns_services"));
  if (dns_services) {
    if (*dns_services != "asked" && *dns_services != "all")
      return field_error(doc.where(*t.get("dns_services")),
                         "'dns_services' must be \"asked\" (the jobs its DNS clients ask for) or "
                         "\"all\" (every job of the region)");
    c.dns_all_services = *dns_services == "all";
  }
  TRY_ASSIGN(auto usage, doc.get_string(t, "usage_interval"));
  if (usage) {
    auto us = parse_duration_us(*usage);
    if (!us.ok() || *us < 1'000'000 || *us > 300'000'000)
      return field_error(doc.where(*t.get("usage_interval")),
                         "'usage_interval' must be a duration from 1s to 5m, such as \"10s\"");
    c.usage_interval_us = *us;
  }
  TRY(doc.read_strings(t, {{"advertise_address", &c.advertise_address}}));
  if (!c.advertise_address.empty() && !valid_ip_address(c.advertise_address))
    return field_error(doc.where(*t.get("advertise_address")),
                       "'advertise_address' must be an IPv4 or IPv6 address");
  TRY(metrics::read_listen(doc, t, &c.metrics_listen));
  TRY_ASSIGN(auto allow_root, doc.get_bool(t, "allow_root_tasks"));
  c.allow_root_tasks = allow_root.value_or(false);
  TRY_ASSIGN(auto allow_unconfined, doc.get_bool(t, "allow_unconfined_tasks"));
  c.allow_unconfined_tasks = allow_unconfined.value_or(false);
  TRY_ASSIGN(auto journald, doc.get_bool(t, "log_journald"));
  c.log_journald = journald.value_or(false);
  TRY(doc.read_strings(t, {{"journald_socket", &c.journald_socket}}));
  if (c.journald_socket.empty() || c.journald_socket[0] != '/' || c.journald_socket.size() > 100)
    return field_error(doc.where(*t.get("journald_socket")),
                       "'journald_socket' must be an absolute path of at most 100 bytes");
  TRY_ASSIGN(c.labels, doc.get_string_map(t, "labels"));
  auto at = [&](const char* key) { return t.get(key) ? doc.where(*t.get(key)) : name; };
  TRY_ASSIGN(auto pool, doc.get_int(t, "netns_pool"));
  if (pool) {
    if (*pool < 0 || *pool > 64)
      return field_error(at("netns_pool"), "'netns_pool' must be 0 to 64 (namespaces kept ready)");
    c.netns_pool = static_cast<size_t>(*pool);
  }
  TRY_ASSIGN(auto sandboxes, doc.get_int(t, "sandbox_pool"));
  if (sandboxes) {
    if (*sandboxes < 0 || *sandboxes > 64)
      return field_error(at("sandbox_pool"),
                         "'sandbox_pool' must be 0 to 64 (sandboxes kept ready)");
    c.sandbox_pool = static_cast<size_t>(*sandboxes);
  }
  TRY_ASSIGN(auto insecure_cp, doc.get_bool(t, "insecure_control_plane"));
  c.insecure_control_plane = insecure_cp.value_or(false);
  TRY(read_control_plane_tls(doc, t, &c.control_plane_tls));
  TRY_ASSIGN(const toml::table* volumes, doc.get_table(t, "volumes"));
  if (volumes) {
    TRY(doc.only_keys(*volumes, "volumes.", {"allowed_host_paths"}));
    TRY_ASSIGN(auto paths, doc.get_string_list(*volumes, "allowed_host_paths"));
    for (const auto& p : paths.value_or(std::vector<std::string>{})) {
      if (p.size() < 2 || p[0] != '/' || p.find(':') != std::string::npos)
        return field_error(doc.where(*volumes->get("allowed_host_paths")),
                           "'" + p +
                               "' in volumes.allowed_host_paths must be an absolute path "
                               "other than / and without ':'");
      // The kernel's own trees are the host itself: a task given one of them is not
      // confined (a task's own /proc, /sys and /dev are weft's, not these).
      std::string clean = p;
      while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
      for (const char* kernel : {"/proc", "/sys", "/dev", "/boot"})
        if (clean == kernel || clean.rfind(std::string(kernel) + "/", 0) == 0 ||
            clean.find("/../") != std::string::npos || clean.ends_with("/.."))
          return field_error(doc.where(*volumes->get("allowed_host_paths")),
                             "'" + p +
                                 "' in volumes.allowed_host_paths is a kernel tree of the host "
                                 "(/proc, /sys, /dev, /boot) or climbs with ..: never granted to "
                                 "tasks");
      c.volume_host_paths.push_back(p);
    }
  }
  TRY_ASSIGN(const toml::table* bridge, doc.get_table(t, "bridge"));
  if (bridge) TRY(parse_bridge(doc, *bridge, &c));
  TRY_ASSIGN(const toml::table* images, doc.get_table(t, "images"));
  if (images) {
    std::vector<std::string> keys = registry::kRegistryConfigKeys;
    keys.push_back("cache_max");
    keys.push_back("download_rate");
    keys.push_back("reserve");
    TRY(doc.only_keys(*images, "images.", {}, keys));
    TRY(registry::read_registry_config(doc, *images, &c.registry));
    TRY_ASSIGN(auto max, doc.get_string(*images, "cache_max"));
    if (max) {
      auto n = parse_size(*max);
      if (!n.ok() || *n < (uint64_t{1} << 20))
        return field_error(doc.where(*images->get("cache_max")),
                           "'images.cache_max' must be a size of at least 1M, e.g. \"20G\"");
      c.image_cache_max = *n;
    }
    TRY_ASSIGN(auto reserve, doc.get_string(*images, "reserve"));
    if (reserve) {
      auto n = parse_size(*reserve);
      if (!n.ok())
        return field_error(doc.where(*images->get("reserve")),
                           "'images.reserve' must be a size, e.g. \"1G\" (\"0\" for none)");
      c.image_reserve = *n;
    }
    TRY_ASSIGN(auto rate, doc.get_string(*images, "download_rate"));
    if (rate) {
      auto n = parse_size(*rate);
      if (!n.ok() || *n < (uint64_t{64} << 10))
        return field_error(doc.where(*images->get("download_rate")),
                           "'images.download_rate' must be bytes a second of at least 64K, e.g. "
                           "\"100M\"");
      c.registry.max_download_rate = *n;
    }
  }
  TRY(check_control_plane_endpoint(c.control_plane, at("control_plane"), c.insecure_control_plane,
                                   c.control_plane_tls.files.enabled()));
  for (auto [key, val] : {std::pair{"socket", &c.socket}, {"state_dir", &c.state_dir}}) {
    if (val->empty() || (*val)[0] != '/')
      return field_error(at(key), std::string("'") + key + "' must be an absolute path");
  }
  if (!c.cgroup_root.empty() && c.cgroup_root[0] != '/' && c.cgroup_root.rfind("systemd:", 0) != 0)
    return field_error(
        at("cgroup_root"),
        "'cgroup_root' must be an absolute path or systemd:<path below the cgroup2 mount>");
  if (!log_level_name_valid(c.log_level))
    return field_error(at("log_level"), "'log_level' must be debug, info, warning or error");
  for (const auto& [k, v] : c.labels) {
    if (k.empty() || k.size() > 63 || k.find_first_of(" =\n") != std::string::npos)
      return field_error(at("labels"), "label name '" + k + "' is not valid");
  }
  // What the control plane is told (dc, rack or msb, type) is checked as it checks it.
  for (const char* k : {"dc", "rack", "msb", "type"})
    if (auto it = c.labels.find(k); it != c.labels.end())
      TRY(check_machine_name(at("labels") + ": labels." + k, it->second, false));
  TRY(check_machine_name(at("machine_id") + ": machine_id", c.machine_id, false));
  return c;
}

Result<AgentConfig> load_agent_config(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse_agent_config(text, path);
}

Status check_cgroup2_dir(const std::string& path) {
  std::string p = path;
  struct statfs fs {};
  // The root may not exist yet (the agent creates it): its nearest existing ancestor
  // tells the filesystem.
  while (::statfs(p.c_str(), &fs) < 0) {
    if (errno != ENOENT || p == "/" || p.empty())
      return field_error("cgroup_root", "cannot inspect " + p + ": " + std::strerror(errno));
    p = dirname_of(p);
  }
  if (fs.f_type != CGROUP2_SUPER_MAGIC)
    return field_error("cgroup_root",
                       "'" + path + "' is not on a cgroup2 filesystem (see docs/configuration.md)");
  return {};
}

Status resolve_agent_config(AgentConfig* cfg, bool under_systemd) {
  HostPaths host(cfg->host_root);
  if (cfg->cgroup_root.empty() || cfg->cgroup_root.rfind("systemd:", 0) == 0) {
    TRY_ASSIGN(std::string mount, host.cgroup2_mount());
    if (cfg->cgroup_root.rfind("systemd:", 0) == 0) {
      std::string rel = cfg->cgroup_root.substr(8);
      while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
      if (rel.empty() || rel.find("..") != std::string::npos)
        return field_error(
            "cgroup_root",
            "'systemd:' needs a cgroup path such as system.slice/weft-tasks.service");
      cfg->cgroup_root = mount + "/" + rel;
    } else if (under_systemd) {
      TRY_ASSIGN(std::string own, host.own_cgroup());
      // Restarted agents find themselves in <root>/agent already.
      if (own.size() >= 6 && own.compare(own.size() - 6, 6, "/agent") == 0)
        own.resize(own.size() - 6);
      cfg->cgroup_root = mount + (own == "/" ? "" : own);
    } else {
      cfg->cgroup_root = mount + "/weft";
    }
  }
  cfg->agent_in_root = true;
  if (under_systemd) {
    // systemd tracks the agent by its unit's cgroup: stay there unless that cgroup is
    // the root the agent was given (the delegated-unit layout).
    auto mount = host.cgroup2_mount();
    auto own = host.own_cgroup();
    if (mount.ok() && own.ok()) {
      std::string own_dir = *mount + (*own == "/" ? "" : *own);
      cfg->agent_in_root = own_dir == cfg->cgroup_root || own_dir == cfg->cgroup_root + "/agent";
    }
  }
  cfg->machine_id = resolve_machine_id(cfg->machine_id, cfg->host_root);
  TRY(check_machine_name("machine_id", cfg->machine_id, true));
  if (cfg->init_path.empty()) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    std::string next_to_me;
    if (n > 0) next_to_me = dirname_of(std::string(self, static_cast<size_t>(n))) + "/weft-init";
    cfg->init_path = (!next_to_me.empty() && path_exists(next_to_me))
                         ? next_to_me
                         : std::string(WEFT_LIBEXECDIR) + "/weft-init";
  }
  if (access(cfg->init_path.c_str(), X_OK) != 0)
    return sys_error("weft-init is not executable at " + cfg->init_path + " (set init_path)");
  return {};
}

}  // namespace weft::agent
