#include "agent/cgroup.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <tuple>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {

Status RealCgroupFs::mkdir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) < 0 && errno != EEXIST) return sys_error("mkdir " + dir);
  return {};
}
Status RealCgroupFs::rmdir(const std::string& dir) {
  if (::rmdir(dir.c_str()) < 0 && errno != ENOENT) return sys_error("rmdir " + dir);
  return {};
}
Result<std::string> RealCgroupFs::read(const std::string& file) {
  return read_file(file);
}
Status RealCgroupFs::write(const std::string& file, const std::string& value) {
  return write_file(file, value);
}
bool RealCgroupFs::exists(const std::string& path) {
  return path_exists(path);
}
Result<std::vector<std::string>> RealCgroupFs::subdirs(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return sys_error("opendir " + dir);
  std::vector<std::string> out;
  while (auto* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (e->d_type == DT_DIR && n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

namespace {

std::string u64(uint64_t v) {
  return std::to_string(v);
}

}  // namespace

std::unique_ptr<CgroupFs> make_real_cgroupfs() {
  return std::make_unique<RealCgroupFs>();
}

std::vector<CgroupWrite> limit_writes(const TaskResources& r) {
  std::vector<CgroupWrite> w;
  if (r.cpu) {
    const uint64_t period = 100000;
    auto quota = static_cast<uint64_t>(std::llround(*r.cpu * static_cast<double>(period)));
    w.push_back({"cpu.max", u64(quota) + " " + u64(period), "cpu", "resources.cpu"});
  }
  if (r.cpu_weight) w.push_back({"cpu.weight", u64(*r.cpu_weight), "cpu", "resources.cpu_weight"});
  if (!r.cpuset_cpus.empty())
    w.push_back({"cpuset.cpus", r.cpuset_cpus, "cpuset", "resources.cpuset_cpus"});
  if (!r.cpuset_mems.empty())
    w.push_back({"cpuset.mems", r.cpuset_mems, "cpuset", "resources.cpuset_mems"});
  // memory.high before memory.max so a lowered max never sits below high mid-way.
  if (r.memory_high)
    w.push_back({"memory.high", u64(*r.memory_high), "memory", "resources.memory_high"});
  if (r.memory_max)
    w.push_back({"memory.max", u64(*r.memory_max), "memory", "resources.memory_max"});
  if (r.memory_swap_max)
    w.push_back(
        {"memory.swap.max", u64(*r.memory_swap_max), "memory", "resources.memory_swap_max"});
  if (r.pids_max) w.push_back({"pids.max", u64(*r.pids_max), "pids", "resources.pids_max"});
  for (size_t i = 0; i < r.io_max.size(); ++i) {
    const auto& l = r.io_max[i];
    std::string v = l.device;
    if (l.rbps) v += " rbps=" + u64(*l.rbps);
    if (l.wbps) v += " wbps=" + u64(*l.wbps);
    if (l.riops) v += " riops=" + u64(*l.riops);
    if (l.wiops) v += " wiops=" + u64(*l.wiops);
    w.push_back({"io.max", v, "io", "resources.io_max[" + std::to_string(i) + "]"});
  }
  for (const auto& [size, bytes] : r.hugetlb)
    w.push_back({"hugetlb." + size + ".max", u64(bytes), "hugetlb", "resources.hugetlb." + size});
  return w;
}

Result<LimitPlan> plan_limits(const TaskResources& r, const std::set<std::string>& controllers,
                              const std::set<std::string>& hugepage_sizes) {
  LimitPlan plan;
  for (auto& w : limit_writes(r)) {
    if (w.controller == "hugetlb" && controllers.count("hugetlb")) {
      std::string size = w.file.substr(8, w.file.size() - 8 - 4);
      if (!hugepage_sizes.count(size)) {
        std::string have;
        for (const auto& s : hugepage_sizes) have += (have.empty() ? "" : ", ") + s;
        return field_error(w.field, "huge page size " + size + " is not supported here (have: " +
                                        (have.empty() ? "none" : have) + ")");
      }
    }
    if (controllers.count(w.controller)) {
      plan.apply.push_back(std::move(w));
      continue;
    }
    std::string have;
    for (const auto& c : controllers) have += (have.empty() ? "" : " ") + c;
    std::string msg =
        "cgroup controller '" + w.controller +
        "' is not available on this machine (available: " + (have.empty() ? "none" : have) + ")";
    if (!r.best_effort)
      return field_error(w.field, msg + "; set resources.best_effort to run without it");
    plan.warnings.push_back(w.field + ": " + msg + "; not enforced");
  }
  return plan;
}

CgroupTree::CgroupTree(CgroupFs& fs, std::string root, HostPaths host)
    : fs_(fs), root_(std::move(root)), host_(std::move(host)) {}

// Controllers weft uses for tasks; others ("misc", "rdma") are left alone.
static bool wanted_controller(const std::string& c) {
  return c == "cpu" || c == "cpuset" || c == "memory" || c == "pids" || c == "io" || c == "hugetlb";
}

Status CgroupTree::enable_in_ancestors() {
  // Outside systemd nobody has delegated controllers to our root: enable the ones we use
  // in every ancestor between the cgroup2 mount and the root, as systemd would with
  // Delegate=yes. Failures leave the controller unavailable, which the agent reports.
  auto mount = host_.cgroup2_mount();
  if (!mount.ok() || root_.rfind(*mount + "/", 0) != 0) return {};
  std::vector<std::string> chain;
  for (std::string d = dirname_of(root_); d.size() >= mount->size(); d = dirname_of(d)) {
    chain.insert(chain.begin(), d);
    if (d == *mount) break;
  }
  for (const auto& dir : chain) {
    auto avail = fs_.read(dir + "/cgroup.controllers");
    if (!avail.ok()) continue;
    for (const auto& c : split(trim(*avail), ' ')) {
      if (!wanted_controller(c)) continue;
      (void)fs_.write(dir + "/cgroup.subtree_control", "+" + c);
    }
  }
  return {};
}

Status CgroupTree::setup(int self_pid) {
  TRY(enable_in_ancestors());
  TRY(fs_.mkdir(root_));
  if (self_pid > 0) {
    TRY(fs_.mkdir(agent_dir()));
    TRY_CTX(fs_.write(agent_dir() + "/cgroup.procs", std::to_string(self_pid)),
            "move the agent into its leaf cgroup");
  }
  // Controllers can be enabled for children only while the root holds no process.
  // Whatever systemd started in a delegated root (the keep-alive process of
  // weft-tasks.service) moves to a leaf of its own.
  TRY_ASSIGN(std::string members, fs_.read(root_ + "/cgroup.procs"));
  for (const auto& pid : split(trim(members), '\n')) {
    if (trim(pid).empty()) continue;
    TRY(fs_.mkdir(root_ + "/holder"));
    TRY_CTX(fs_.write(root_ + "/holder/cgroup.procs", trim(pid)),
            "move process " + trim(pid) + " out of the cgroup root");
  }
  TRY_ASSIGN(std::string avail, fs_.read(root_ + "/cgroup.controllers"));
  controllers_.clear();
  std::string enable;
  for (const auto& c : split(trim(avail), ' ')) {
    if (c.empty()) continue;
    // cpuset and the rest are enabled only when present; "misc"/"rdma" are not used.
    if (wanted_controller(c)) {
      controllers_.insert(c);
      enable += (enable.empty() ? "+" : " +") + c;
    }
  }
  if (!enable.empty())
    TRY_CTX(fs_.write(root_ + "/cgroup.subtree_control", enable), "enable controllers");
  TRY(fs_.mkdir(root_ + "/tasks"));
  if (!enable.empty())
    TRY_CTX(fs_.write(root_ + "/tasks/cgroup.subtree_control", enable),
            "enable controllers for tasks");
  hugepage_sizes_.clear();
  if (controllers_.count("hugetlb")) {
    auto dirs = list_dir(host_.sys("kernel/mm/hugepages"));
    if (dirs.ok()) {
      for (const auto& d : *dirs) {  // "hugepages-2048kB"
        if (d.rfind("hugepages-", 0) != 0) continue;
        std::string n = normalize_hugepage_size(d.substr(10, d.size() - 10 - 2) + "K");
        if (!n.empty()) hugepage_sizes_.insert(n);
      }
    }
  }
  return {};
}

Status CgroupTree::create_task(const std::string& id, const std::vector<CgroupWrite>& writes) {
  std::string dir = task_dir(id);
  TRY(fs_.mkdir(dir));
  if (controllers_.count("memory")) {
    // One OOM kill takes the whole task: a half-killed task is worse than a restart.
    Status s = fs_.write(dir + "/memory.oom.group", "1");
    if (!s.ok()) {
      (void)fs_.rmdir(dir);
      return std::move(s).error().wrap("set memory.oom.group");
    }
  }
  Status s = apply_limits(id, writes);
  if (!s.ok()) (void)fs_.rmdir(dir);
  return s;
}

Status CgroupTree::apply_limits(const std::string& id, const std::vector<CgroupWrite>& writes) {
  std::string dir = task_dir(id);
  for (const auto& w : writes) {
    Status s = fs_.write(dir + "/" + w.file, w.value);
    if (!s.ok()) {
      Error e = std::move(s).error();
      e.field = w.field;
      return e;
    }
  }
  return {};
}

Status CgroupTree::kill_task(const std::string& id) {
  std::string dir = task_dir(id);
  if (!fs_.exists(dir)) return {};
  if (fs_.exists(dir + "/cgroup.kill")) return fs_.write(dir + "/cgroup.kill", "1");
  // Kernels before 5.14: freeze, SIGKILL every member, thaw.
  TRY(freeze_task(id, true));
  TRY_ASSIGN(auto pids, procs(id));
  for (int p : pids) ::kill(p, SIGKILL);
  return freeze_task(id, false);
}

namespace {
constexpr const char* kCheckCgroup = "/weft-check";
constexpr const char* kLiveCgroup = "/weft-live";
const std::string kExecCgroup = "/weft-exec-";
}  // namespace

Result<std::string> CgroupTree::helper_dir(const std::string& id, const std::string& name) {
  std::string dir = task_dir(id) + name;
  if (!fs_.exists(dir)) TRY(fs_.mkdir(dir));
  return dir;
}

bool CgroupTree::end_helper(const std::string& id, const std::string& name) {
  std::string dir = task_dir(id) + name;
  if (!fs_.exists(dir)) return true;
  if (fs_.exists(dir + "/cgroup.kill")) (void)fs_.write(dir + "/cgroup.kill", "1");
  // EBUSY while the killed leave: the caller asks again, or the next check or
  // remove_task removes it.
  return fs_.rmdir(dir).ok();
}

Result<std::string> CgroupTree::check_dir(const std::string& id, bool liveness) {
  return helper_dir(id, liveness ? kLiveCgroup : kCheckCgroup);
}

void CgroupTree::end_check(const std::string& id, bool liveness) {
  (void)end_helper(id, liveness ? kLiveCgroup : kCheckCgroup);
}

Result<std::string> CgroupTree::exec_dir(const std::string& id, uint64_t n) {
  return helper_dir(id, kExecCgroup + std::to_string(n));
}

bool CgroupTree::end_exec(const std::string& id, uint64_t n) {
  return end_helper(id, kExecCgroup + std::to_string(n));
}

Status CgroupTree::remove_task(const std::string& id, int wait_ms) {
  std::string dir = task_dir(id);
  if (!fs_.exists(dir)) return {};
  TRY(kill_task(id));  // cgroup.kill takes the check's cgroup beneath too
  int waited = 0;
  std::vector<std::string> dirs = {dir + kCheckCgroup, dir + kLiveCgroup};
  if (auto subs = fs_.subdirs(dir); subs.ok())
    for (const auto& sub : *subs)
      if (sub.rfind(kExecCgroup.substr(1), 0) == 0) dirs.push_back(dir + "/" + sub);
  dirs.push_back(dir);
  for (const std::string& d : dirs) {
    if (d != dir && !fs_.exists(d)) continue;
    for (;; ++waited) {
      Status s = fs_.rmdir(d);
      if (s.ok()) break;
      if (s.error().errnum != EBUSY || waited >= wait_ms) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return {};
}

Status CgroupTree::freeze_task(const std::string& id, bool frozen_state) {
  return fs_.write(task_dir(id) + "/cgroup.freeze", frozen_state ? "1" : "0");
}

Result<std::map<std::string, std::string>> CgroupTree::read_keyed(const std::string& file) {
  TRY_ASSIGN(std::string data, fs_.read(file));
  std::map<std::string, std::string> out;
  for (const auto& line : split(data, '\n')) {
    auto sp = line.find(' ');
    if (sp != std::string::npos) out[line.substr(0, sp)] = trim(line.substr(sp + 1));
  }
  return out;
}

Result<bool> CgroupTree::frozen(const std::string& id) {
  TRY_ASSIGN(auto ev, read_keyed(task_dir(id) + "/cgroup.events"));
  return ev["frozen"] == "1";
}

Result<bool> CgroupTree::populated(const std::string& id) {
  TRY_ASSIGN(auto ev, read_keyed(task_dir(id) + "/cgroup.events"));
  return ev["populated"] == "1";
}

Result<std::vector<int>> CgroupTree::procs(const std::string& id) {
  TRY_ASSIGN(std::string data, fs_.read(task_dir(id) + "/cgroup.procs"));
  std::vector<int> out;
  for (const auto& l : split(data, '\n'))
    if (!trim(l).empty()) out.push_back(std::stoi(l));
  return out;
}

Result<std::vector<std::string>> CgroupTree::task_ids() {
  return fs_.subdirs(root_ + "/tasks");
}

std::optional<uint64_t> CgroupTree::oom_kills(const std::string& id) {
  if (!controllers_.count("memory")) return std::nullopt;
  auto ev = read_keyed(task_dir(id) + "/memory.events");
  if (!ev.ok() || !ev->count("oom_kill")) return std::nullopt;
  return std::stoull((*ev)["oom_kill"]);
}

static std::optional<uint64_t> to_u64(const std::map<std::string, std::string>& m, const char* k) {
  auto it = m.find(k);
  if (it == m.end() || it->second.empty()) return std::nullopt;
  return std::strtoull(it->second.c_str(), nullptr, 10);
}

CgroupStats CgroupTree::stats(const std::string& id) {
  CgroupStats s;
  std::string dir = task_dir(id);
  if (auto cpu = read_keyed(dir + "/cpu.stat"); cpu.ok()) {
    s.cpu_usage_usec = to_u64(*cpu, "usage_usec");
    s.cpu_user_usec = to_u64(*cpu, "user_usec");
    s.cpu_system_usec = to_u64(*cpu, "system_usec");
    s.cpu_throttled_usec = to_u64(*cpu, "throttled_usec");
    s.cpu_nr_throttled = to_u64(*cpu, "nr_throttled");
  }
  auto single = [&](const char* f) -> std::optional<uint64_t> {
    auto v = fs_.read(dir + "/" + f);
    if (!v.ok()) return std::nullopt;
    std::string t = trim(*v);
    if (t.empty() || t == "max") return std::nullopt;
    return std::strtoull(t.c_str(), nullptr, 10);
  };
  s.memory_current = single("memory.current");
  s.memory_peak = single("memory.peak");
  s.pids_current = single("pids.current");
  for (const char* res : {"cpu", "memory", "io"}) {
    auto v = fs_.read(dir + "/" + res + ".pressure");
    if (!v.ok()) continue;
    nlohmann::json p = nlohmann::json::object();
    for (const auto& line : split(*v, '\n')) {  // "some avg10=0.00 avg60=0.00 avg300=0.00 total=0"
      auto parts = split(trim(line), ' ');
      if (parts.size() < 2) continue;
      nlohmann::json kv = nlohmann::json::object();
      for (size_t i = 1; i < parts.size(); ++i) {
        auto eq = parts[i].find('=');
        if (eq == std::string::npos) continue;
        std::string k = parts[i].substr(0, eq), val = parts[i].substr(eq + 1);
        if (k == "total")
          kv[k] = std::strtoull(val.c_str(), nullptr, 10);
        else
          kv[k] = std::strtod(val.c_str(), nullptr);
      }
      p[parts[0]] = kv;
    }
    s.pressure[res] = p;
  }
  return s;
}

std::pair<uint64_t, uint64_t> io_stat_bytes(std::string_view io_stat) {
  uint64_t r = 0, w = 0;
  for (const auto& line : split(std::string(io_stat), '\n'))
    for (const auto& part : split(trim(line), ' ')) {
      auto eq = part.find('=');
      if (eq == std::string::npos) continue;
      std::string_view k(part.data(), eq);
      uint64_t v = std::strtoull(part.c_str() + eq + 1, nullptr, 10);
      if (k == "rbytes") r += v;
      if (k == "wbytes") w += v;
    }
  return {r, w};
}

std::optional<UsageCounters> CgroupTree::usage(const std::string& id) {
  std::string dir = task_dir(id);
  auto cpu = read_keyed(dir + "/cpu.stat");  // always there on a cgroup v2 directory
  if (!cpu.ok()) return std::nullopt;
  UsageCounters c;
  c.cpu_usec = to_u64(*cpu, "usage_usec").value_or(0);
  if (auto m = fs_.read(dir + "/memory.current"); m.ok())
    c.mem_bytes = std::strtoull(trim(*m).c_str(), nullptr, 10);
  if (auto io = fs_.read(dir + "/io.stat"); io.ok())
    std::tie(c.io_read_bytes, c.io_write_bytes) = io_stat_bytes(*io);
  return c;
}

nlohmann::json CgroupStats::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  auto put = [&](const char* k, const std::optional<uint64_t>& v) {
    if (v) j[k] = *v;
  };
  put("cpu_usage_usec", cpu_usage_usec);
  put("cpu_user_usec", cpu_user_usec);
  put("cpu_system_usec", cpu_system_usec);
  put("cpu_throttled_usec", cpu_throttled_usec);
  put("cpu_nr_throttled", cpu_nr_throttled);
  put("memory_current", memory_current);
  put("memory_peak", memory_peak);
  put("pids_current", pids_current);
  if (!pressure.empty()) j["pressure"] = pressure;
  return j;
}

}  // namespace weft::agent
