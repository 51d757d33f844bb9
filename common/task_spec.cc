#include "common/task_spec.h"

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <set>

#include "common/fs.h"
#include "common/oci.h"
#include "common/rpc/protocol.h"
#include "common/strings.h"
#include "common/units.h"

namespace weft {

using json = nlohmann::json;

namespace {

// Field-path aware accessors. `path` is the dotted name used in errors.
class Reader {
 public:
  Reader(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  Status only(std::initializer_list<const char*> keys) const {
    if (!obj_.is_object())
      return field_error(path_.empty() ? "params" : path_, "must be an object");
    for (const auto& [k, v] : obj_.items()) {
      bool known = false;
      for (const char* a : keys) known |= (k == a);
      if (!known) return field_error(name(k), "unknown field");
    }
    return {};
  }
  bool has(const char* k) const { return obj_.contains(k) && !obj_[k].is_null(); }
  const json& at(const char* k) const { return obj_[k]; }
  std::string name(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }

  Result<std::string> str(const char* k, std::string def = "") const {
    if (!has(k)) return def;
    if (!obj_[k].is_string()) return field_error(name(k), "must be a string");
    return obj_[k].get<std::string>();
  }
  Result<bool> boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!obj_[k].is_boolean()) return field_error(name(k), "must be true or false");
    return obj_[k].get<bool>();
  }
  Result<std::optional<uint64_t>> uint(const char* k, uint64_t min, uint64_t max) const {
    if (!has(k)) return std::optional<uint64_t>();
    const json& v = obj_[k];
    if (!v.is_number_integer() ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      return field_error(name(k), "must be a non-negative integer");
    uint64_t x = v.get<uint64_t>();
    if (x < min || x > max)
      return field_error(name(k),
                         "must be between " + std::to_string(min) + " and " + std::to_string(max));
    return std::optional<uint64_t>(x);
  }
  // An integer byte count or a string with a unit ("256M").
  Result<std::optional<uint64_t>> size(const char* k) const {
    if (!has(k)) return std::optional<uint64_t>();
    const json& v = obj_[k];
    if (v.is_number_integer() && v.get<int64_t>() >= 0)
      return std::optional<uint64_t>(v.get<uint64_t>());
    if (v.is_string()) {
      auto r = parse_size(v.get<std::string>());
      if (!r.ok()) return field_error(name(k), r.error().message);
      return std::optional<uint64_t>(*r);
    }
    return field_error(name(k), "must be a byte count or a size such as \"256M\"");
  }
  // Seconds as a number, or a string with a unit ("500ms").
  Result<std::optional<uint64_t>> duration(const char* k) const {
    if (!has(k)) return std::optional<uint64_t>();
    const json& v = obj_[k];
    if (v.is_number()) {
      auto us = seconds_to_us(v.get<double>());
      if (!us.ok()) return field_error(name(k), us.error().message);
      return std::optional<uint64_t>(*us);
    }
    if (v.is_string()) {
      auto r = parse_duration_us(v.get<std::string>());
      if (!r.ok()) return field_error(name(k), r.error().message);
      return std::optional<uint64_t>(*r);
    }
    return field_error(name(k), "must be seconds or a duration such as \"5s\"");
  }

 private:
  const json& obj_;
  std::string path_;
};

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 63) return false;
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  }
  return n[0] != '.' && n[0] != '-';
}

bool valid_cpulist(const std::string& s) {
  if (s.empty()) return false;
  for (const auto& part : split(s, ',')) {
    auto range = split(part, '-');
    if (range.empty() || range.size() > 2) return false;
    for (const auto& n : range) {
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) return false;
    }
    if (range.size() == 2 && std::stoul(range[0]) > std::stoul(range[1])) return false;
  }
  return true;
}

Status parse_resources(const Reader& r, TaskResources* out) {
  TRY(r.only({"cpu", "cpu_weight", "memory_max", "memory_high", "memory_swap_max", "pids_max",
              "io_max", "hugetlb", "cpuset_cpus", "cpuset_mems", "best_effort"}));
  if (r.has("cpu")) {
    const json& v = r.at("cpu");
    if (!v.is_number() || v.get<double>() <= 0 || v.get<double>() > 4096)
      return field_error(r.name("cpu"), "must be a number of cores greater than 0 (e.g. 0.5)");
    if (v.get<double>() * 100000 < 1000)
      return field_error(r.name("cpu"), "must be at least 0.01 cores");
    out->cpu = v.get<double>();
  }
  TRY_ASSIGN(out->cpu_weight, r.uint("cpu_weight", 1, 10000));
  TRY_ASSIGN(out->memory_max, r.size("memory_max"));
  TRY_ASSIGN(out->memory_high, r.size("memory_high"));
  TRY_ASSIGN(out->memory_swap_max, r.size("memory_swap_max"));
  TRY_ASSIGN(out->pids_max, r.uint("pids_max", 1, 4194304));
  if (out->memory_max && *out->memory_max < (1u << 20))
    return field_error(r.name("memory_max"), "must be at least 1M");
  if (out->memory_max && out->memory_high && *out->memory_high > *out->memory_max)
    return field_error(r.name("memory_high"), "must not exceed memory_max");
  if (r.has("io_max")) {
    const json& arr = r.at("io_max");
    if (!arr.is_array()) return field_error(r.name("io_max"), "must be a list");
    for (size_t i = 0; i < arr.size(); ++i) {
      Reader e(arr[i], r.name("io_max") + "[" + std::to_string(i) + "]");
      TRY(e.only({"device", "rbps", "wbps", "riops", "wiops"}));
      IoLimit l;
      TRY_ASSIGN(l.device, e.str("device"));
      auto mm = split(l.device, ':');
      if (mm.size() != 2 || mm[0].empty() || mm[1].empty() ||
          (mm[0] + mm[1]).find_first_not_of("0123456789") != std::string::npos)
        return field_error(e.name("device"), "must be MAJOR:MINOR, e.g. \"8:0\"");
      TRY_ASSIGN(l.rbps, e.size("rbps"));
      TRY_ASSIGN(l.wbps, e.size("wbps"));
      TRY_ASSIGN(l.riops, e.uint("riops", 1, UINT64_MAX));
      TRY_ASSIGN(l.wiops, e.uint("wiops", 1, UINT64_MAX));
      if (!l.rbps && !l.wbps && !l.riops && !l.wiops)
        return field_error(e.name("device"), "needs at least one of rbps, wbps, riops, wiops");
      out->io_max.push_back(l);
    }
  }
  if (r.has("hugetlb")) {
    const json& h = r.at("hugetlb");
    if (!h.is_object()) return field_error(r.name("hugetlb"), "must map page size to a limit");
    Reader hr(h, r.name("hugetlb"));
    for (const auto& [k, v] : h.items()) {
      std::string size = normalize_hugepage_size(k);
      if (size.empty()) return field_error(hr.name(k), "is not a huge page size (e.g. 2M, 1G)");
      TRY_ASSIGN(auto bytes, hr.size(k.c_str()));
      if (!bytes) return field_error(hr.name(k), "needs a limit");
      out->hugetlb[size] = *bytes;
    }
  }
  TRY_ASSIGN(out->cpuset_cpus, r.str("cpuset_cpus"));
  if (!out->cpuset_cpus.empty() && !valid_cpulist(out->cpuset_cpus))
    return field_error(r.name("cpuset_cpus"), "must be a CPU list such as \"0-3,8\"");
  TRY_ASSIGN(out->cpuset_mems, r.str("cpuset_mems"));
  if (!out->cpuset_mems.empty() && !valid_cpulist(out->cpuset_mems))
    return field_error(r.name("cpuset_mems"), "must be a node list such as \"0\"");
  TRY_ASSIGN(out->best_effort, r.boolean("best_effort", false));
  return {};
}

}  // namespace

std::string normalize_hugepage_size(const std::string& in) {
  auto n = parse_size(in);
  if (!n.ok() || *n < 4096) return "";
  uint64_t kb = *n / 1024;
  if (kb * 1024 != *n) return "";
  if (kb % (1024 * 1024) == 0) return std::to_string(kb / (1024 * 1024)) + "GB";
  if (kb % 1024 == 0) return std::to_string(kb / 1024) + "MB";
  return std::to_string(kb) + "KB";
}

Result<int> parse_signal(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) {
    int n = std::stoi(s.substr(0, 3));
    if (n >= 1 && n < NSIG) return n;
    return make_error("signal number out of range: " + s);
  }
  std::string up;
  for (char c : s) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (up.rfind("SIG", 0) == 0) up = up.substr(3);
  for (int sig = 1; sig < SIGRTMIN; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev && up == abbrev) return sig;
  }
  return make_error("unknown signal '" + s + "'");
}

std::string signal_name(int sig) {
  const char* abbrev = sig > 0 && sig < SIGRTMIN ? sigabbrev_np(sig) : nullptr;
  return abbrev ? std::string("SIG") + abbrev : std::to_string(sig);
}

const char* policy_name(RestartPolicy p) {
  switch (p) {
    case RestartPolicy::kNever:
      return "never";
    case RestartPolicy::kOnFailure:
      return "on-failure";
    case RestartPolicy::kAlways:
      return "always";
  }
  return "never";
}

const char* network_name(NetworkMode m) {
  switch (m) {
    case NetworkMode::kHost:
      return "host";
    case NetworkMode::kPrivate:
      return "private";
    case NetworkMode::kBridge:
      return "bridge";
    case NetworkMode::kOwn:
      return "own";
  }
  return "host";
}

namespace {

Status parse_readiness(const Reader& r, ReadinessCheck* c) {
  TRY(r.only({"type", "port", "path", "command", "interval", "timeout", "initial_delay",
              "success_threshold", "failure_threshold"}));
  TRY_ASSIGN(std::string type, r.str("type"));
  if (type == "tcp")
    c->kind = ReadinessKind::kTcp;
  else if (type == "http")
    c->kind = ReadinessKind::kHttp;
  else if (type == "exec")
    c->kind = ReadinessKind::kExec;
  else
    return field_error(r.name("type"), "must be \"tcp\", \"http\" or \"exec\"");
  std::optional<uint64_t> port;
  if (r.has("port") && r.at("port").is_string()) {
    TRY_ASSIGN(c->port_name, r.str("port"));
    if (!valid_port_name(c->port_name))
      return field_error(r.name("port"), "must be a port number or the name of one of ports");
    port = 0;
  } else {
    TRY_ASSIGN(port, r.uint("port", 1, 65535));
  }
  if (c->kind != ReadinessKind::kExec) {
    if (!port) return field_error(r.name("port"), "is required for a " + type + " check");
    c->port = static_cast<uint16_t>(*port);
  } else if (port) {
    return field_error(r.name("port"), "is for tcp and http checks");
  }
  if (r.has("path")) {
    if (c->kind != ReadinessKind::kHttp) return field_error(r.name("path"), "is for http checks");
    TRY_ASSIGN(c->path, r.str("path"));
    // It goes into the request line: no space, control character or non-ASCII byte.
    bool ok = !c->path.empty() && c->path[0] == '/' && c->path.size() <= 1024;
    for (unsigned char ch : c->path) ok = ok && ch > 0x20 && ch < 0x7f;
    if (!ok)
      return field_error(r.name("path"),
                         "must start with '/' and be at most 1024 printable ASCII characters "
                         "without spaces");
  }
  if (r.has("command")) {
    if (c->kind != ReadinessKind::kExec)
      return field_error(r.name("command"), "is for exec checks");
    const json& cmd = r.at("command");
    if (!cmd.is_array() || cmd.empty() || cmd.size() > 64)
      return field_error(r.name("command"), "must be a list of 1 to 64 strings");
    for (size_t i = 0; i < cmd.size(); ++i) {
      std::string f = r.name("command") + "[" + std::to_string(i) + "]";
      if (!cmd[i].is_string()) return field_error(f, "must be a string");
      std::string a = cmd[i].get<std::string>();
      if (a.find('\0') != std::string::npos || a.size() > 4096)
        return field_error(f, "must be at most 4096 characters without NUL");
      c->command.push_back(a);
    }
    if (c->command[0].empty() || c->command[0][0] != '/')
      return field_error(r.name("command") + "[0]", "must be an absolute path");
  } else if (c->kind == ReadinessKind::kExec) {
    return field_error(r.name("command"), "is required for an exec check");
  }
  TRY_ASSIGN(auto interval, r.duration("interval"));
  TRY_ASSIGN(auto timeout, r.duration("timeout"));
  TRY_ASSIGN(auto delay, r.duration("initial_delay"));
  if (interval) c->interval_us = *interval;
  if (timeout) c->timeout_us = *timeout;
  if (delay) c->initial_delay_us = *delay;
  if (c->interval_us < 100'000 || c->interval_us > 3'600'000'000)
    return field_error(r.name("interval"), "must be between 100ms and 1h");
  if (c->timeout_us < 10'000 || c->timeout_us > 60'000'000)
    return field_error(r.name("timeout"), "must be between 10ms and 60s");
  if (c->initial_delay_us > 3'600'000'000)
    return field_error(r.name("initial_delay"), "must be at most 1h");
  TRY_ASSIGN(auto st, r.uint("success_threshold", 1, 100));
  TRY_ASSIGN(auto ft, r.uint("failure_threshold", 1, 100));
  if (st) c->success_threshold = *st;
  if (ft) c->failure_threshold = *ft;
  return {};
}

// A path inside the task: absolute, plain, not the root, outside the kernel's trees.
Status check_task_path(const std::string& field, const std::string& p) {
  if (p.size() < 2 || p[0] != '/' || p.size() > 1024 || p.back() == '/')
    return field_error(field, "must be an absolute path (not \"/\"), at most 1024 characters");
  for (unsigned char c : p)
    if (c < 0x20 || c == 0x7f || c == ':')
      return field_error(field, "must not contain control characters or ':'");
  for (const auto& part : split(p.substr(1), '/'))
    if (part.empty() || part == "." || part == "..")
      return field_error(field, "must be a plain path (no empty, \".\" or \"..\" parts)");
  for (const char* reserved : {"/proc", "/dev", "/sys"}) {
    std::string r = reserved;
    if (p == r || p.rfind(r + "/", 0) == 0)
      return field_error(field, "must not be under " + r + " (the task's own, set up by weft)");
  }
  return {};
}

// `package = { url, sha256, target }`. The URL is fetched by the agent: http or https,
// a host, no credentials in it (they would sit in every copy of the spec), printable.
Result<PackageSpec> parse_package(const json& v) {
  if (!v.is_object()) return field_error("package", "must be a table { url, sha256, target }");
  Reader r(v, "package");
  TRY(r.only({"url", "sha256", "target"}));
  PackageSpec p;
  TRY_ASSIGN(p.url, r.str("url"));
  size_t scheme = p.url.rfind("https://", 0) == 0 ? 8 : p.url.rfind("http://", 0) == 0 ? 7 : 0;
  if (scheme == 0) return field_error("package.url", "must be an http:// or https:// URL");
  if (p.url.size() > 2048) return field_error("package.url", "must be at most 2048 characters");
  for (unsigned char c : p.url)
    if (c <= 0x20 || c >= 0x7f)
      return field_error("package.url", "must be printable ASCII without spaces");
  std::string authority = p.url.substr(scheme, p.url.find_first_of("/?#", scheme) - scheme);
  if (authority.empty()) return field_error("package.url", "names no host");
  if (authority.find('@') != std::string::npos)
    return field_error("package.url", "must not carry credentials");
  TRY_ASSIGN(p.sha256, r.str("sha256"));
  if (p.sha256.rfind("sha256:", 0) == 0) p.sha256 = p.sha256.substr(7);
  for (char& c : p.sha256) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (p.sha256.size() != 64 || p.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
    return field_error("package.sha256", "must be 64 hexadecimal digits (the tarball's SHA-256)");
  TRY_ASSIGN(p.target, r.str("target", "/"));
  if (p.target != "/") TRY(check_task_path("package.target", p.target));
  return p;
}

Result<uint32_t> parse_mode(const Reader& r, const char* key, uint32_t def) {
  if (!r.has(key)) return def;
  const json& v = r.at(key);
  std::string text;
  if (v.is_string()) {
    text = v.get<std::string>();
  } else if (v.is_number_unsigned()) {
    text = std::to_string(v.get<uint64_t>());  // 400 as written means 0400
  } else {
    return field_error(r.name(key), "must be an octal mode such as \"0400\"");
  }
  if (text.empty() || text.size() > 5 || text.find_first_not_of("01234567") != std::string::npos)
    return field_error(r.name(key), "must be an octal mode such as \"0400\"");
  uint32_t m = static_cast<uint32_t>(std::stoul(text, nullptr, 8));
  if (m > 01777) return field_error(r.name(key), "must be at most 1777");
  return m;
}

Status parse_mounts(const json& arr, std::vector<MountSpec>* out) {
  if (!arr.is_array() || arr.size() > 32)
    return field_error("mounts", "must be a list of at most 32 mounts");
  for (size_t i = 0; i < arr.size(); ++i) {
    Reader m(arr[i], "mounts[" + std::to_string(i) + "]");
    TRY(m.only({"type", "source", "target", "readonly", "size", "mode"}));
    MountSpec ms;
    TRY_ASSIGN(std::string type, m.str("type", "bind"));
    if (type == "bind")
      ms.kind = MountKind::kBind;
    else if (type == "tmpfs")
      ms.kind = MountKind::kTmpfs;
    else
      return field_error(m.name("type"), "must be \"bind\" or \"tmpfs\"");
    TRY_ASSIGN(ms.target, m.str("target"));
    TRY(check_task_path(m.name("target"), ms.target));
    if (ms.kind == MountKind::kBind) {
      TRY_ASSIGN(ms.source, m.str("source"));
      if (ms.source.empty() || ms.source[0] != '/' || ms.source.size() > 1024 ||
          ms.source.find(':') != std::string::npos || ms.source.find('\0') != std::string::npos)
        return field_error(m.name("source"),
                           "must be an absolute host path without ':' (at most 1024 characters)");
      TRY_ASSIGN(ms.readonly, m.boolean("readonly", true));
      if (m.has("size") || m.has("mode"))
        return field_error(m.name(m.has("size") ? "size" : "mode"), "is for tmpfs mounts");
    } else {
      if (m.has("source")) return field_error(m.name("source"), "is for bind mounts");
      TRY_ASSIGN(ms.readonly, m.boolean("readonly", false));
      TRY_ASSIGN(auto size, m.size("size"));
      if (size) {
        if (*size < 4096 || *size > (uint64_t{64} << 30))
          return field_error(m.name("size"), "must be between 4K and 64G");
        ms.size = *size;
      }
      TRY_ASSIGN(ms.mode, parse_mode(m, "mode", 01777));
    }
    for (const auto& other : *out)
      if (other.target == ms.target)
        return field_error(m.name("target"), "'" + ms.target + "' is mounted twice");
    out->push_back(std::move(ms));
  }
  return {};
}

Status parse_files(const json& arr, std::vector<FileSpec>* out) {
  if (!arr.is_array() || arr.size() > 64)
    return field_error("files", "must be a list of at most 64 files");
  uint64_t total = 0;
  for (size_t i = 0; i < arr.size(); ++i) {
    Reader f(arr[i], "files[" + std::to_string(i) + "]");
    TRY(f.only({"path", "content", "mode"}));
    FileSpec fs;
    TRY_ASSIGN(fs.path, f.str("path"));
    TRY(check_task_path(f.name("path"), fs.path));
    if (!f.has("content")) return field_error(f.name("content"), "is required");
    TRY_ASSIGN(fs.content, f.str("content"));
    if (fs.content.size() > (1u << 20))
      return field_error(f.name("content"), "must be at most 1 MiB");
    total += fs.content.size();
    if (total > (4u << 20)) return field_error("files", "must hold at most 4 MiB in all");
    TRY_ASSIGN(fs.mode, parse_mode(f, "mode", 0400));
    if (fs.mode & 07000)
      return field_error(f.name("mode"), "must not set setuid, setgid or sticky");
    for (const auto& other : *out)
      if (other.path == fs.path)
        return field_error(f.name("path"), "'" + fs.path + "' is given twice");
    out->push_back(std::move(fs));
  }
  return {};
}

}  // namespace

const char* readiness_kind_name(ReadinessKind k) {
  switch (k) {
    case ReadinessKind::kTcp:
      return "tcp";
    case ReadinessKind::kHttp:
      return "http";
    case ReadinessKind::kExec:
      return "exec";
  }
  return "tcp";
}

namespace {

json readiness_json(const ReadinessCheck& c) {
  json j{{"type", readiness_kind_name(c.kind)},
         {"interval", std::to_string(c.interval_us) + "us"},
         {"timeout", std::to_string(c.timeout_us) + "us"},
         {"initial_delay", std::to_string(c.initial_delay_us) + "us"},
         {"success_threshold", c.success_threshold},
         {"failure_threshold", c.failure_threshold}};
  if (c.kind != ReadinessKind::kExec) {
    if (c.port_name.empty())
      j["port"] = c.port;
    else
      j["port"] = c.port_name;
  }
  if (c.kind == ReadinessKind::kHttp) j["path"] = c.path;
  if (c.kind == ReadinessKind::kExec) j["command"] = c.command;
  return j;
}

}  // namespace

Result<TaskSpec> parse_task_spec(const json& j) {
  TaskSpec s;
  Reader r(j, "");
  TRY(r.only({"name",    "argv",        "env",        "cwd",         "user",
              "group",   "resources",   "rootfs",     "namespaces",  "hostname",
              "restart", "stop_signal", "stop_grace", "logs",        "owner",
              "seccomp", "readiness",   "liveness",   "image",       "mounts",
              "files",   "package",     "ports",      "entitlement", "at_most_one"}));
  TRY_ASSIGN(s.name, r.str("name"));
  TRY_ASSIGN(s.owner, r.str("owner"));
  if (!s.owner.empty() && s.owner != "controlplane")
    return field_error("owner", "must be \"controlplane\" or absent");
  TRY_ASSIGN(s.entitlement, r.str("entitlement"));
  if (!s.entitlement.empty() && (s.owner.empty() || !valid_name(s.entitlement)))
    return field_error("entitlement", "is set by the control plane for its own tasks only");
  TRY_ASSIGN(s.at_most_one, r.boolean("at_most_one", false));
  if (s.at_most_one && s.owner.empty())
    return field_error("at_most_one", "is set by the control plane for its own tasks only");
  if (!valid_name(s.name))
    return field_error("name", "must be 1-63 characters of letters, digits, '-', '_' or '.'");
  TRY_ASSIGN(s.image, r.str("image"));
  if (!s.image.empty()) {
    auto ref = oci::parse_image_ref(s.image);
    if (!ref.ok()) return field_error("image", ref.error().message);
    s.image = ref->str();
  }
  if (r.has("package")) {
    TRY_ASSIGN(PackageSpec pkg, parse_package(r.at("package")));
    s.package = std::move(pkg);
  }
  bool argv_optional =
      !s.image.empty() && (!r.has("argv") || (r.at("argv").is_array() && r.at("argv").empty()));
  if (!argv_optional && (!r.has("argv") || !r.at("argv").is_array() || r.at("argv").empty()))
    return field_error("argv", s.image.empty() ? "must be a non-empty list of strings"
                                               : "must be a list of strings");
  if (r.has("argv") && r.at("argv").size() > 4096)
    return field_error("argv", "must have at most 4096 arguments");
  for (size_t i = 0; r.has("argv") && i < r.at("argv").size(); ++i) {
    const json& a = r.at("argv")[i];
    if (!a.is_string()) return field_error("argv[" + std::to_string(i) + "]", "must be a string");
    std::string v = a.get<std::string>();
    if (v.find('\0') != std::string::npos)
      return field_error("argv[" + std::to_string(i) + "]", "must not contain NUL");
    s.argv.push_back(v);
  }
  if (!s.argv.empty() && s.argv[0].empty()) return field_error("argv[0]", "must not be empty");
  if (r.has("env")) {
    if (!r.at("env").is_object()) return field_error("env", "must map names to string values");
    for (const auto& [k, v] : r.at("env").items()) {
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
        return field_error("env." + k, "is not a valid variable name");
      if (!v.is_string()) return field_error("env." + k, "must be a string");
      s.env[k] = v.get<std::string>();
    }
  }
  TRY_ASSIGN(s.cwd, r.str("cwd"));
  if (r.has("cwd") && (s.cwd.empty() || s.cwd[0] != '/'))
    return field_error("cwd", "must be an absolute path");
  TRY_ASSIGN(s.user, r.str("user"));
  TRY_ASSIGN(s.group, r.str("group"));
  if (r.has("resources"))
    TRY(parse_resources(Reader(r.at("resources"), "resources"), &s.resources));
  TRY_ASSIGN(s.rootfs, r.str("rootfs"));
  if (!s.rootfs.empty() && s.rootfs[0] != '/')
    return field_error("rootfs", "must be an absolute path");
  if (!s.rootfs.empty() && s.rootfs.find_first_not_of('/') == std::string::npos)
    return field_error("rootfs",
                       "must not be / (it cannot be the task's own root; without rootfs the "
                       "task shares the host's)");
  if (r.has("namespaces")) {
    Reader n(r.at("namespaces"), "namespaces");
    TRY(n.only({"pid", "mount", "uts", "ipc", "network"}));
    TRY_ASSIGN(s.ns.pid, n.boolean("pid", true));
    TRY_ASSIGN(s.ns.mount, n.boolean("mount", true));
    TRY_ASSIGN(s.ns.uts, n.boolean("uts", true));
    TRY_ASSIGN(s.ns.ipc, n.boolean("ipc", true));
    TRY_ASSIGN(std::string net, n.str("network", "host"));
    if (net == "host")
      s.ns.network = NetworkMode::kHost;
    else if (net == "private")
      s.ns.network = NetworkMode::kPrivate;
    else if (net == "bridge")
      s.ns.network = NetworkMode::kBridge;
    else if (net == "own")
      s.ns.network = NetworkMode::kOwn;
    else
      return field_error("namespaces.network",
                         "must be \"own\", \"bridge\", \"private\" or \"host\"");
  }
  if (!s.rootfs.empty() && !s.ns.mount)
    return field_error("rootfs", "needs namespaces.mount = true");
  if (!s.image.empty() && !s.rootfs.empty())
    return field_error("image", "and rootfs cannot both be given (an image is the root)");
  if (!s.image.empty() && !s.ns.mount) return field_error("image", "needs namespaces.mount = true");
  bool package_root = s.package && s.package->target == "/";
  if (s.package) {
    if (package_root && (!s.image.empty() || !s.rootfs.empty()))
      return field_error("package.target",
                         "must name a directory (not \"/\") when the task has an image or rootfs");
    if (!s.ns.mount) return field_error("package", "needs namespaces.mount = true");
  }
  if (r.has("mounts")) TRY(parse_mounts(r.at("mounts"), &s.mounts));
  if (r.has("files")) TRY(parse_files(r.at("files"), &s.files));
  bool own_root = !s.image.empty() || !s.rootfs.empty() || package_root;
  if (s.package && !package_root) {
    const std::string& pt = s.package->target;
    auto overlaps = [&](const std::string& other) {
      return other == pt || other.rfind(pt + "/", 0) == 0 || pt.rfind(other + "/", 0) == 0;
    };
    for (const auto& m : s.mounts)
      if (overlaps(m.target))
        return field_error("package.target", "'" + pt + "' overlaps the mount at " + m.target);
    for (const auto& f : s.files)
      if (overlaps(f.path))
        return field_error("package.target", "'" + pt + "' overlaps the file " + f.path);
  }
  if (!own_root && !s.mounts.empty())
    return field_error("mounts",
                       "need an image, a rootfs or a package root (a root of the task's own)");
  if (!own_root && !s.files.empty())
    return field_error("files",
                       "need an image, a rootfs or a package root (a root of the task's own)");
  for (const auto& f : s.files)
    for (const auto& m : s.mounts)
      if (f.path == m.target || f.path.rfind(m.target + "/", 0) == 0)
        return field_error("files", "'" + f.path + "' is under the mount at " + m.target);
  TRY_ASSIGN(std::string seccomp, r.str("seccomp"));
  if (!seccomp.empty() && seccomp != "default" && seccomp != "unconfined")
    return field_error("seccomp", "must be \"default\" or \"unconfined\"");
  s.seccomp_unconfined = seccomp == "unconfined";
  TRY_ASSIGN(s.hostname, r.str("hostname"));
  if (!s.hostname.empty()) {
    if (!s.ns.uts) return field_error("hostname", "needs namespaces.uts = true");
    if (s.hostname.size() > 64) return field_error("hostname", "must be at most 64 characters");
  }
  if (r.has("restart")) {
    Reader rr(r.at("restart"), "restart");
    TRY(rr.only({"policy", "delay", "max_delay", "reset_after", "max_restarts"}));
    TRY_ASSIGN(std::string p, rr.str("policy", "never"));
    if (p == "never")
      s.restart.policy = RestartPolicy::kNever;
    else if (p == "on-failure")
      s.restart.policy = RestartPolicy::kOnFailure;
    else if (p == "always")
      s.restart.policy = RestartPolicy::kAlways;
    else
      return field_error("restart.policy", "must be never, on-failure or always");
    TRY_ASSIGN(auto d, rr.duration("delay"));
    TRY_ASSIGN(auto md, rr.duration("max_delay"));
    TRY_ASSIGN(auto ra, rr.duration("reset_after"));
    if (d) s.restart.delay_us = *d;
    if (md) s.restart.max_delay_us = *md;
    if (ra) s.restart.reset_after_us = *ra;
    if (s.restart.max_delay_us < s.restart.delay_us)
      return field_error("restart.max_delay", "must be at least restart.delay");
    if (rr.has("max_restarts")) {
      const json& m = rr.at("max_restarts");
      if (!m.is_number_integer() || m.get<int64_t>() < -1)
        return field_error("restart.max_restarts", "must be an integer >= -1 (-1 = unlimited)");
      s.restart.max_restarts = m.get<int64_t>();
    }
  }
  TRY_ASSIGN(std::string sig, r.str("stop_signal", "SIGTERM"));
  auto sn = parse_signal(sig);
  if (!sn.ok()) return field_error("stop_signal", sn.error().message);
  s.stop_signal = *sn;
  TRY_ASSIGN(auto grace, r.duration("stop_grace"));
  if (grace) s.stop_grace_us = *grace;
  if (r.has("logs")) {
    Reader l(r.at("logs"), "logs");
    TRY(l.only({"max_file_size", "max_files"}));
    TRY_ASSIGN(auto mfs, l.size("max_file_size"));
    TRY_ASSIGN(auto mf, l.uint("max_files", 1, 1000));
    if (mfs) {
      if (*mfs < 4096) return field_error("logs.max_file_size", "must be at least 4K");
      s.logs.max_file_bytes = *mfs;
    }
    if (mf) s.logs.max_files = *mf;
  }
  if (r.has("ports")) {
    const json& ports = r.at("ports");
    if (!ports.is_object() || ports.size() > kMaxTaskPorts)
      return field_error("ports", "must be a table of at most " + std::to_string(kMaxTaskPorts) +
                                      " names and port numbers (0: any free port)");
    std::map<uint16_t, std::string> fixed;
    Reader pr(ports, "ports");
    for (const auto& [name, v] : ports.items()) {
      if (!valid_port_name(name))
        return field_error("ports." + name,
                           "a port's name is 1-15 lowercase letters, digits and '-', starting "
                           "with a letter");
      TRY_ASSIGN(auto n, pr.uint(name.c_str(), 0, 65535));
      auto port = static_cast<uint16_t>(*n);
      if (port != 0 && !fixed.emplace(port, name).second)
        return field_error("ports." + name,
                           "port " + std::to_string(port) + " is also ports." + fixed[port]);
      s.ports[name] = port;
    }
    if (s.ns.network == NetworkMode::kPrivate)
      return field_error("ports",
                         "are published on the machine's address: a task with "
                         "namespaces.network = \"private\" cannot be reached on them (use "
                         "\"bridge\" or \"host\")");
  }
  for (auto [key, out] :
       {std::pair{"readiness", &s.readiness}, std::pair{"liveness", &s.liveness}}) {
    if (!r.has(key)) continue;
    ReadinessCheck c;
    TRY(parse_readiness(Reader(r.at(key), key), &c));
    if (!c.port_name.empty()) {
      auto it = s.ports.find(c.port_name);
      if (it == s.ports.end())
        return field_error(std::string(key) + ".port", "names no port of ports: " + c.port_name);
      c.port = it->second;
    }
    *out = std::move(c);
  }
  return s;
}

bool valid_port_name(const std::string& n) {
  if (n.empty() || n.size() > 15 || !(n[0] >= 'a' && n[0] <= 'z') || n.back() == '-') return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

std::string port_env_name(const std::string& name) {
  std::string out = "WEFT_PORT_";
  for (char c : name) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

Status resolve_task_ports(TaskSpec* spec, uint16_t first, uint16_t last,
                          const std::function<std::string(uint16_t)>& holder, uint16_t* next,
                          const std::function<std::string(uint16_t)>& machines_own) {
  std::set<uint16_t> mine;
  for (const auto& [name, port] : spec->ports) {
    if (port == 0) continue;
    if (std::string who = holder(port); !who.empty())
      return field_error("ports." + name,
                         "port " + std::to_string(port) + " is held by task " + who)
          .with_code(rpc::kUnsupported);
    if (std::string why = machines_own ? machines_own(port) : ""; !why.empty())
      return field_error("ports." + name, "port " + std::to_string(port) +
                                              " is the machine's own (" + why +
                                              "): a task never takes it")
          .with_code(rpc::kUnsupported);
    mine.insert(port);
  }
  if (first == 0 || last < first) first = last = 0;
  uint32_t span = last - first + 1u;
  uint32_t at = next && *next >= first && *next <= last ? *next - first : 0;
  for (auto& [name, port] : spec->ports) {
    if (port != 0) continue;
    for (uint32_t tried = 0; tried < span && first != 0; ++tried, at = (at + 1) % span) {
      auto candidate = static_cast<uint16_t>(first + at);
      if (mine.count(candidate) || !holder(candidate).empty()) continue;
      if (machines_own && !machines_own(candidate).empty()) continue;
      port = candidate;
      at = (at + 1) % span;
      break;
    }
    if (port == 0)
      return field_error("ports." + name, "no free port is left in the machine's port_range")
          .with_code(rpc::kUnsupported);
    mine.insert(port);
  }
  if (next && first != 0) *next = static_cast<uint16_t>(first + at);
  for (auto* check : {&spec->readiness, &spec->liveness})
    if (*check && !(*check)->port_name.empty()) (*check)->port = spec->ports[(*check)->port_name];
  for (const auto& [name, port] : spec->ports)
    spec->env[port_env_name(name)] = std::to_string(port);
  return {};
}

Result<PackageSpec> parse_package_spec(const json& j) {
  return parse_package(j);
}

json to_json(const TaskSpec& s) {
  json j;
  j["name"] = s.name;
  j["argv"] = s.argv;
  j["env"] = s.env;
  if (!s.cwd.empty()) j["cwd"] = s.cwd;
  if (!s.image.empty()) j["image"] = s.image;
  if (s.package)
    j["package"] = {
        {"url", s.package->url}, {"sha256", s.package->sha256}, {"target", s.package->target}};
  if (!s.mounts.empty()) {
    json arr = json::array();
    for (const auto& m : s.mounts) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", m.mode);
      if (m.kind == MountKind::kBind)
        arr.push_back({{"type", "bind"},
                       {"source", m.source},
                       {"target", m.target},
                       {"readonly", m.readonly}});
      else
        arr.push_back({{"type", "tmpfs"},
                       {"target", m.target},
                       {"readonly", m.readonly},
                       {"size", m.size},
                       {"mode", mode}});
    }
    j["mounts"] = arr;
  }
  if (!s.files.empty()) {
    json arr = json::array();
    for (const auto& f : s.files) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", f.mode);
      arr.push_back({{"path", f.path}, {"content", f.content}, {"mode", mode}});
    }
    j["files"] = arr;
  }
  if (!s.user.empty()) j["user"] = s.user;
  if (!s.group.empty()) j["group"] = s.group;
  if (!s.owner.empty()) j["owner"] = s.owner;
  if (!s.entitlement.empty()) j["entitlement"] = s.entitlement;
  if (s.at_most_one) j["at_most_one"] = true;
  if (s.seccomp_unconfined) j["seccomp"] = "unconfined";
  json res = json::object();
  const TaskResources& r = s.resources;
  if (r.cpu) res["cpu"] = *r.cpu;
  if (r.cpu_weight) res["cpu_weight"] = *r.cpu_weight;
  if (r.memory_max) res["memory_max"] = *r.memory_max;
  if (r.memory_high) res["memory_high"] = *r.memory_high;
  if (r.memory_swap_max) res["memory_swap_max"] = *r.memory_swap_max;
  if (r.pids_max) res["pids_max"] = *r.pids_max;
  if (!r.io_max.empty()) {
    json arr = json::array();
    for (const auto& l : r.io_max) {
      json e{{"device", l.device}};
      if (l.rbps) e["rbps"] = *l.rbps;
      if (l.wbps) e["wbps"] = *l.wbps;
      if (l.riops) e["riops"] = *l.riops;
      if (l.wiops) e["wiops"] = *l.wiops;
      arr.push_back(e);
    }
    res["io_max"] = arr;
  }
  if (!r.hugetlb.empty()) res["hugetlb"] = r.hugetlb;
  if (!r.cpuset_cpus.empty()) res["cpuset_cpus"] = r.cpuset_cpus;
  if (!r.cpuset_mems.empty()) res["cpuset_mems"] = r.cpuset_mems;
  if (r.best_effort) res["best_effort"] = true;
  j["resources"] = res;
  if (!s.rootfs.empty()) j["rootfs"] = s.rootfs;
  j["namespaces"] = {{"pid", s.ns.pid},
                     {"mount", s.ns.mount},
                     {"uts", s.ns.uts},
                     {"ipc", s.ns.ipc},
                     {"network", network_name(s.ns.network)}};
  if (!s.hostname.empty()) j["hostname"] = s.hostname;
  j["restart"] = {{"policy", policy_name(s.restart.policy)},
                  {"delay", std::to_string(s.restart.delay_us) + "us"},
                  {"max_delay", std::to_string(s.restart.max_delay_us) + "us"},
                  {"reset_after", std::to_string(s.restart.reset_after_us) + "us"},
                  {"max_restarts", s.restart.max_restarts}};
  j["stop_signal"] = signal_name(s.stop_signal);
  j["stop_grace"] = std::to_string(s.stop_grace_us) + "us";
  j["logs"] = {{"max_file_size", s.logs.max_file_bytes}, {"max_files", s.logs.max_files}};
  if (s.readiness) j["readiness"] = readiness_json(*s.readiness);
  if (s.liveness) j["liveness"] = readiness_json(*s.liveness);
  if (!s.ports.empty()) j["ports"] = s.ports;
  return j;
}

}  // namespace weft
