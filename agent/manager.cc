#include "agent/manager.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "agent/init/argv.h"
#include "agent/spawn.h"
#include "agent/start_plan.h"
#include "agent/task_root.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/task_report.h"

namespace weft::agent {

using json = nlohmann::json;
using rpc::RpcCode;

namespace {

int64_t now_us() {
  return static_cast<int64_t>(now_realtime_us());
}

// Fault injection for the crash-recovery tests: WEFT_AGENT_CRASH_AT=<point> makes the
// agent SIGKILL itself when it reaches that point of a task's lifecycle.
void crash_point(const char* point) {
  static const char* want = std::getenv("WEFT_AGENT_CRASH_AT");
  if (want && std::strcmp(want, point) == 0) ::raise(SIGKILL);
}

// Fault injection for the start's undo test: WEFT_AGENT_FAIL_AT=<point>[#N] makes a
// start fail at that point the Nth time one reaches it (the first without #N), as a
// kernel refusing that step would.
Status fail_point(const char* point) {
  static const char* want = std::getenv("WEFT_AGENT_FAIL_AT");
  static long reached = 0;
  if (!want) return {};
  std::string_view w(want);
  long nth = 1;
  if (auto hash = w.find('#'); hash != std::string_view::npos) {
    nth = std::strtol(want + hash + 1, nullptr, 10);
    w = w.substr(0, hash);
  }
  if (w != point || ++reached != nth) return {};
  return make_error(std::string("injected failure at ") + point + " (WEFT_AGENT_FAIL_AT)");
}

}  // namespace

Manager::Manager(AgentConfig cfg, std::unique_ptr<CgroupFs> fs, std::unique_ptr<EventLoop> loop)
    : cfg_(std::move(cfg)), fs_(std::move(fs)), loop_(std::move(loop)) {}

Manager::~Manager() {
  // The session first: replies it fails on closing go to what is still here
  // (discovery_'s service.interest among them).
  cp_calls_.cp_.reset();
  server_.reset();
  sandboxes_.reset();
  tasks_.clear();  // drops watches before the loop goes
}

Result<std::unique_ptr<Manager>> Manager::create(AgentConfig cfg, std::unique_ptr<CgroupFs> fs) {
  TRY_ASSIGN(auto loop, EventLoop::create());
  return std::unique_ptr<Manager>(new Manager(std::move(cfg), std::move(fs), std::move(loop)));
}

// This host: whether it restarted since the last start, its cgroup tree (set up), the
// network namespaces made ahead, and the bridge when one is configured (a bridge that
// cannot be made refuses bridge tasks, not the agent).
Status Manager::open_host() {
  HostPaths host(cfg_.host_root);
  // Did the machine restart since the last start? Then no task of the database survived
  // (exit records are not flushed to disk: docs/decisions.md).
  if (auto boot = read_file(host.proc("sys/kernel/random/boot_id")); boot.ok()) {
    std::string now_boot = trim(*boot), path = cfg_.state_dir + "/boot_id";
    boot_.id = now_boot;
    auto last = read_file(path);
    boot_.restarted = last.ok() && trim(*last) != now_boot;
    if (!last.ok() || boot_.restarted) (void)write_file_atomic(path, now_boot + "\n");
  }
  auto mount = host.cgroup2_mount();
  cgroup_mount_ = mount.ok() ? *mount : "";
  cgroups_ = std::make_unique<CgroupTree>(*fs_, cfg_.cgroup_root, host);
  net_.netns_pool_ = std::make_unique<NetnsPool>(cfg_.netns_pool);
  if (!cfg_.bridge.empty()) {
    auto b = Bridge::open(cfg_.bridge, cfg_.bridge_net, cfg_.bridge_prefix, cfg_.bridge_host_ports);
    if (b.ok()) {
      net_.bridge_ = std::move(b).value();
    } else {
      // The agent still runs its other tasks; bridge tasks are refused with this reason.
      net_.bridge_failure_ = b.error().str();
      log_error(
          "the bridge could not be made: tasks with namespaces.network = \"bridge\" are "
          "refused",
          {{"BRIDGE", cfg_.bridge}, {"ERROR", net_.bridge_failure_}});
    }
  }
  TRY_CTX(cgroups_->setup(cfg_.agent_in_root ? getpid() : 0),
          "set up cgroup tree at " + cfg_.cgroup_root);
  return {};
}

// Readiness and liveness (task_checks.h), with what they need of the agent: a task by id,
// its identity, a report now when a control-plane task's readiness changes, and the
// control plane told of a task that failed its liveness checks.
void Manager::make_checks() {
  checks_ = std::make_unique<TaskChecks>(
      *loop_, *http_, *reaper_, *cgroups_, cfg_.init_path,
      TaskChecks::Hooks{[this](const std::string& id) -> Task* {
                          auto it = tasks_.find(id);
                          return it == tasks_.end() ? nullptr : it->second.get();
                        },
                        [this](Task& t) { return ids_.identity_of(&t, t.spec); },
                        [this](Task& t) {
                          if (cp_calls_.cp_ && t.spec.owner == "controlplane")
                            cp_calls_.cp_->report_now();
                        },
                        [this](Task& t, const std::string& why) {
                          return cp_calls_.cp_ && cp_calls_.cp_->unhealthy(t.spec.name, why);
                        }});
}

// The image service (agent/image/service.h) on the agent's state directory, and its calls.
Status Manager::open_images() {
  image::ServiceConfig icfg;
  icfg.registry = cfg_.registry;
  icfg.cache_max_bytes = cfg_.image_cache_max;
  icfg.reserve_bytes = cfg_.image_reserve;
  TRY_ASSIGN(fetching_.images_, image::Service::open(*loop_, cfg_.state_dir + "/images", icfg));
  fetching_.image_calls_ = std::make_unique<ImageCalls>(cfg_, *fetching_.images_);

  return {};
}

Status Manager::start() {
  api_.started_at_us_ = now_monotonic_us();
  waiters_ = std::make_unique<TaskWaiters>(
      *loop_, [this](const std::string& id, bool remove) { return api_.wait_answer(id, remove); });
  TRY_ASSIGN(http_, HttpClient::create(*loop_));
  reaper_ = std::make_unique<Reaper>(*loop_);
  // One pidfd per running task: weft-agent's main raised RLIMIT_NOFILE to the hard
  // limit already (raise_fd_limit, common/daemon.h).
  TRY(mkdir_p(cfg_.state_dir, 0750));
  TRY(dirs_.open());
  // Process-crash durability: a task record lost with the power is harmless (the agent
  // kills and removes cgroups it has no record of, and the control plane sends its
  // start again), and an fsync per start would sit on every task's start path.
  // Tasks' secret values are sealed in agent.db with a key of the agent's own, made at
  // the first start (agent/task_store.h).
  TRY_ASSIGN(auto box, SecretBox::load_or_create(cfg_.state_dir + "/secrets.key"));
  TRY_ASSIGN(store_, TaskStore::open(cfg_.state_dir + "/agent.db", std::move(box)));

  TRY(open_host());
  make_checks();

  ids_.weft_gid_ = group_gid(cfg_.socket_group);
  if (ids_.weft_gid_ < 0) {
    log_warn("socket group does not exist; only root may use the agent",
             {{"GROUP", cfg_.socket_group}});
  }

  TRY(open_images());

  TRY(load_tasks());
  recover();
  net_.after_recovery();

  api_.register_methods();
  server_ = std::make_unique<rpc::Server>(*loop_, &api_.methods_);
  TRY(server_->listen_unix(cfg_.socket, 0660, ids_.weft_gid_));

  TRY(loop_->exit_on_termination([] { log_info("shutting down; tasks keep running"); }));
  TRY_ASSIGN(Source hup, loop_->add_signal(SIGHUP, [this] {
    reload_control_plane_tls(cp_calls_.cp_ ? cp_calls_.cp_->link() : nullptr);
  }));
  signals_.push_back(std::move(hup));
  loop_->enable_watchdog();

  std::string ctrls;
  for (const auto& c : cgroups_->controllers()) ctrls += (ctrls.empty() ? "" : " ") + c;
  log_info("agent ready", {{"SOCKET", cfg_.socket},
                           {"CGROUP_ROOT", cfg_.cgroup_root},
                           {"CONTROLLERS", ctrls.empty() ? "none" : ctrls},
                           {"TASKS", std::to_string(tasks_.size())}});
  if (!cfg_.control_plane.empty()) {
    TRY(cp_calls_.add_cp_methods());
    TRY(cp_calls_.cp_start());
  }
  stats_.register_metrics();
  stats_.metrics_http_ = metrics::HttpServer::serve(*loop_, cfg_.metrics_listen, &stats_.metrics_);
  sandboxes_ = std::make_unique<SandboxPool>(
      *loop_, *cgroups_, SandboxPool::Config{cfg_.sandbox_pool, cfg_.init_path}, dirs_,
      [this](const std::string& id) { return tasks_.count(id) > 0; });
  sandboxes_->start();
  usage_ = std::make_unique<UsageSampler>(
      cfg_.usage_interval_us, [this](const std::string& id) { return cgroups_->usage(id); },
      [this] {
        std::vector<std::string> ids;
        for (const auto& [id, t] : tasks_)
          if (t->state == TaskState::kRunning) ids.push_back(id);
        return ids;
      });
  TRY(usage_->start(*loop_));
  sd_notify(0, "READY=1");
  update_status();
  return {};
}

Status Manager::run() {
  return loop_->run();
}

void Manager::update_status() {
  // A task changed state: the control plane hears of it now, not at the next heartbeat
  // (a replacement counts as running as soon as it runs). Coalesced over 20 ms.
  if (cp_calls_.cp_) cp_calls_.cp_->report_soon();
  size_t running = 0;
  for (const auto& [id, t] : tasks_)
    running += (t->state == TaskState::kRunning || t->state == TaskState::kStopping);
  sd_notifyf(0, "STATUS=%zu tasks running, %zu known", running, tasks_.size());
}

std::string Manager::cgroup_rel(const std::string& id) const {
  std::string dir = cgroups_->task_dir(id);
  if (!cgroup_mount_.empty() && dir.rfind(cgroup_mount_, 0) == 0) {
    std::string rel = dir.substr(cgroup_mount_.size());
    return rel.empty() ? "/" : rel;
  }
  return dir;
}

// ---------------------------------------------------------------- persistence

Status Manager::save(const Task& t) {
  if (Status s = store_->save(t); !s.ok()) {
    ++stats_.store_failures_;
    return s;
  }
  net_.publish_bridge();  // a task started or ended: its ports follow (nothing if unchanged)
  return {};
}

Status Manager::erase(const std::string& id) {
  if (Status s = store_->erase(id); !s.ok()) {
    ++stats_.store_failures_;
    return s;
  }
  ids_.release_own_uid(id);  // its processes are gone with its cgroup; its row is too now
  if (auto it = tasks_.find(id); it != tasks_.end() && it->second->bridge_addr != 0) {
    if (net_.bridge_) net_.bridge_->addresses().release(id);
    it->second->bridge_addr = 0;
    net_.publish_bridge();
  }
  return {};
}

Status Manager::load_tasks() {
  TRY_ASSIGN(auto rows, store_->load());
  for (auto& row : rows) {
    auto t = std::make_unique<Task>();
    static_cast<TaskRecord&>(*t) = std::move(row);
    std::string id = t->id;
    if (t->bridge_addr != 0 &&
        !(net_.bridge_ && net_.bridge_->addresses().hold(t->bridge_addr, id))) {
      // Its address is not on this bridge any more (agent.toml changed): a new one at
      // its next start.
      log_warn("a task's bridge address is not kept", {{"TASK_ID", id}});
      t->bridge_addr = 0;
    }
    // A restarted agent gives each task the uid it had, and no other task that one (a
    // uid outside today's task_uids is kept by its task, and never handed out).
    if (t->own_uid >= 0) (void)ids_.own_uids_.hold(static_cast<uint64_t>(t->own_uid), id);
    tasks_[id] = std::move(t);
  }
  return {};
}

// ---------------------------------------------------------------- recovery

int Manager::find_init_pid(const std::string& id) {
  auto procs = cgroups_->procs(id);
  if (!procs.ok() || procs->empty()) return -1;
  std::set<int> members(procs->begin(), procs->end());
  HostPaths host(cfg_.host_root);
  for (int p : *procs) {
    auto stat = read_file(host.proc(std::to_string(p) + "/stat"));
    if (!stat.ok()) continue;
    auto close_paren = stat->rfind(')');
    if (close_paren == std::string::npos) continue;
    auto fields = split(stat->substr(close_paren + 2), ' ');
    if (fields.size() < 2) continue;
    int ppid = std::atoi(fields[1].c_str());
    if (!members.count(ppid)) return p;
  }
  return -1;
}

namespace {
// Whether `pid` is a sandbox's weft-init still waiting for its task (agent/init/init.cc
// await_task): its fd 3 is a socket until it is handed the task directory. False when
// that cannot be read (then it is taken for the task, as before sandboxes).
bool awaits_task(const HostPaths& host, int pid) {
  char target[64] = "";
  std::string link = host.proc(std::to_string(pid) + "/fd/3");
  ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::string_view(target).rfind("socket:", 0) == 0;
}
}  // namespace

void Manager::adopt_or_collect(Task& t) {
  HostPaths host(cfg_.host_root);
  int pid = -1;
  if (t.pid > 0) {
    auto cg = read_file(host.proc(std::to_string(t.pid) + "/cgroup"));
    if (cg.ok() && cg->find("0::" + cgroup_rel(t.id) + "\n") != std::string::npos) pid = t.pid;
  }
  if (pid < 0) pid = find_init_pid(t.id);
  if (pid > 0 && t.state == TaskState::kStarting && awaits_task(host, pid)) {
    // A sandbox made ahead that the dead agent never handed this task (its fd 3 is still
    // the socket it waits on; a handed one has the task's directory there): the start
    // did not happen. It is ending (its agent's end closed), or is ended here; the task
    // is collected as one whose start the restart cut short, not adopted.
    log_info("a sandbox the task was never handed is not the task", {{"TASK_ID", t.id}});
    (void)cgroups_->kill_task(t.id);
    pid = -1;
  }
  if (pid > 0) {
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd >= 0) {
      t.pidfd = Fd(fd);
      t.pid = pid;
      t.is_child = false;
      if (t.state == TaskState::kStarting) {
        t.state = TaskState::kRunning;
        if (t.started_us == 0) t.started_us = now_us();
      }
      (void)save(t);
      watch_init(t);
      if (t.state == TaskState::kStopping) arm_stop_timer(t);
      if (t.state == TaskState::kRunning) checks_->start(t);
      log_info("adopted running task", {{"TASK_ID", t.id}, {"PID", std::to_string(pid)}});
      return;
    }
  }
  // Not running: its exit (if any) is in the record weft-init left behind.
  std::optional<ExitRecord> rec;
  if (auto text = read_file(task_state_dir(t.id) + "/exit"); text.ok()) {
    rec = parse_exit_record(*text);
    if (rec && rec->incarnation != t.incarnation) rec.reset();
  }
  if (!rec && t.reason.empty()) {
    t.reason = boot_.restarted ? "the machine restarted while the task ran"
               : t.state == TaskState::kStarting
                   ? "agent restarted while starting the task"
                   : "task ended while the agent was down, without an exit record";
  }
  log_info("collected exit of a task that ended while the agent was down", {{"TASK_ID", t.id}});
  finish_incarnation(t, rec, std::nullopt);
}

void Manager::recover() {
  std::vector<std::string> ids;
  for (const auto& [id, t] : tasks_) ids.push_back(id);
  // Images and packages of tasks that may run are held before anything could evict them.
  for (const auto& id : ids) {
    Task& t = *tasks_[id];
    if (!t.terminal()) (void)fetching_.have_local(t);
  }
  for (const auto& id : ids) {
    Task& t = *tasks_[id];
    if (t.state == TaskState::kFetching) {
      fetching_.begin_fetch(t);  // the download resumes where it stopped
      continue;
    }
    if (t.state == TaskState::kStarting || t.state == TaskState::kRunning ||
        t.state == TaskState::kStopping) {
      adopt_or_collect(t);
    } else if (t.state == TaskState::kBackoff) {
      schedule_restart(t);  // re-arms the timer from the stored next_start_us
    }
  }
  // Cgroups nobody owns any more: kill and remove.
  auto dirs = cgroups_->task_ids();
  if (dirs.ok()) {
    for (const auto& d : *dirs) {
      auto it = tasks_.find(d);
      bool owned = it != tasks_.end() && (it->second->state == TaskState::kRunning ||
                                          it->second->state == TaskState::kStopping ||
                                          it->second->state == TaskState::kStarting);
      if (owned) continue;
      log_warn("removing unknown task cgroup", {{"CGROUP", cgroups_->task_dir(d)}});
      if (auto s = cgroups_->remove_task(d); !s.ok())
        log_error("could not remove unknown cgroup", {{"ERROR", s.error().str()}});
    }
  }
  // Task directories no record names (a dead agent's sandboxes made theirs ahead): a
  // record is written before its directory, so these belong to no task.
  if (auto entries = list_dir(cfg_.state_dir + "/tasks"); entries.ok()) {
    for (const auto& e : *entries) {
      if (tasks_.count(e)) continue;
      dirs_.remove(e);
    }
  }
}

// ---------------------------------------------------------------- lifecycle

Result<Task*> Manager::create_task(TaskSpec spec) {
  uint64_t began_us = now_monotonic_us();
  // Validate everything that can be known before anything is created (an image task's
  // user is known once its image is here).
  bool package_root = spec.package && spec.package->target == "/";
  if (spec.image.empty() && !package_root) TRY(ids_.identity_of(nullptr, spec));
  TRY(admit_spec(spec, start_policy()));
  TRY_ASSIGN(LimitPlan plan,
             plan_limits(spec.resources, cgroups_->controllers(), cgroups_->hugepage_sizes()));
  for (const auto& [id, t] : tasks_) {
    if (t->name == spec.name && !t->terminal()) {
      Error e =
          field_error("name", "a task named '" + spec.name + "' is already " +
                                  std::string(task_state_name(t->state)) + " (id " + id + ")");
      e.code = RpcCode::kConflict;
      return e;
    }
  }
  std::optional<Sandbox> sandbox = sandboxes_->take(spec);
  auto t = std::make_unique<Task>();
  t->id = sandbox ? sandbox->id : random_hex(8);
  t->name = spec.name;
  t->spec = std::move(spec);
  t->state = TaskState::kStarting;
  t->created_us = now_us();
  t->warnings = plan.warnings;
  Task* raw = t.get();
  if (!fetching_.have_local(*raw)) {
    // Answered at once: the task is "fetching" until its image and package are here.
    TRY_CTX(save(*raw), "record task");
    crash_point("run.recorded");
    tasks_[raw->id] = std::move(t);
    fetching_.begin_fetch(*raw);
    return raw;
  }
  // start_incarnation records the task (one write: "starting") before it makes anything.
  tasks_[raw->id] = std::move(t);
  raw->start_phases = {{"validate", now_monotonic_us() - began_us}};
  Status s = start_incarnation(*raw, sandbox ? &*sandbox : nullptr);
  if (!s.ok()) {
    // Nothing half-made survives a failed start: start_incarnation unmade its cgroup,
    // namespace and sandbox; the task's row and directory go here.
    forget_unstarted(raw->id);
    return std::move(s).error();
  }
  for (const auto& w : raw->warnings) log_warn(w, {{"TASK_ID", raw->id}});
  return raw;
}

void Manager::forget_unstarted(const std::string& id) {
  dirs_.remove(id);
  (void)erase(id);
  fetching_.images_->cache().release(id);
  tasks_.erase(id);
}

namespace {

// The one way back from a start that failed part-way: what the start made is unmade,
// newest first, and a sandbox it was given and did not use is ended (its cgroup, which
// is the task's, with it). Disarmed by done() once weft-init runs the task.
class StartUndo {
 public:
  StartUndo(CgroupTree& cgroups, SandboxPool& sandboxes, std::string id, Sandbox* sandbox)
      : cgroups_(cgroups), sandboxes_(sandboxes), id_(std::move(id)), sandbox_(sandbox) {}
  StartUndo(const StartUndo&) = delete;
  StartUndo& operator=(const StartUndo&) = delete;
  ~StartUndo() {
    if (!done_) unwind();
  }
  // This start made the task's cgroup (not a sandbox's).
  void made_cgroup() { cgroup_ = true; }
  // The sandbox could not take the task: ended now (with its cgroup), before the start
  // makes a cgroup of the same name.
  void end_sandbox() {
    if (sandbox_ && sandbox_->pidfd.valid()) sandboxes_.discard(*sandbox_);
    sandbox_ = nullptr;
  }
  void done() { done_ = true; }

 private:
  void unwind() {
    end_sandbox();
    if (cgroup_) (void)cgroups_.remove_task(id_);
  }
  CgroupTree& cgroups_;
  SandboxPool& sandboxes_;
  std::string id_;
  Sandbox* sandbox_;
  bool cgroup_ = false, done_ = false;
};

}  // namespace

Result<IncarnationPlan> Manager::plan_incarnation(Task& t) {
  IncarnationPlan plan;
  TRY_ASSIGN(plan.limits,
             plan_limits(t.spec.resources, cgroups_->controllers(), cgroups_->hugepage_sizes()));
  StartInputs in;
  in.spec = &t.spec;
  in.policy = &start_policy_;
  in.image = t.image ? &*t.image : nullptr;
  in.package = t.package ? &*t.package : nullptr;
  in.layers_root = fetching_.images_->layers_root();
  in.task_dir = task_state_dir(t.id);
  TRY_ASSIGN(plan.start, plan_start(in));
  const TaskSpec& run_spec = plan.start.run_spec;
  TRY_ASSIGN(
      plan.identity,
      ids_.identity_of(&t, run_spec, plan.start.overlay ? &plan.start.image_roots : nullptr));
  plan.bridged = run_spec.ns.network == NetworkMode::kBridge;
  if (plan.bridged) {
    TRY(net_.refuse_without_bridge(run_spec));
    if (t.bridge_addr == 0) {
      TRY_ASSIGN(t.bridge_addr, net_.bridge_->addresses().take(t.id));
    }
  }
  return plan;
}

std::vector<std::string> Manager::incarnation_argv(const Task& t, const IncarnationPlan& plan,
                                                   bool lo_up) const {
  const StartPlan& sp = plan.start;
  return init_argv(sp.run_spec, plan.identity,
                   InitStart{t.incarnation, sp.overlay ? &*sp.overlay : nullptr, sp.bind_sources,
                             lo_up, journal_fields(t), cfg_.journald_socket});
}

Status Manager::start_incarnation(Task& t, Sandbox* sandbox) {
  uint64_t began_us = now_us();
  // Before anything of this incarnation exists: no earlier moment its program could run.
  t.started_mono_us = now_monotonic_us();
  // Whatever happens below, a sandbox given here is used or ended, and what this start
  // made is unmade unless weft-init runs the task.
  StartUndo undo(*cgroups_, *sandboxes_, t.id, sandbox);
  if (t.incarnation > 0) t.start_phases.clear();  // a restart: this start's phases only
  uint64_t phase_us = now_monotonic_us();
  auto phase = [&](const char* name) {
    uint64_t now = now_monotonic_us();
    t.start_phases.emplace_back(name, now - phase_us);
    phase_us = now;
  };
  if (!fetching_.have_local(t)) {  // evicted while the task was not running (not held): again
    fetching_.begin_fetch(t);
    return {};
  }
  // ---- decided: nothing is made above this line
  TRY_ASSIGN(IncarnationPlan plan, plan_incarnation(t));
  t.identity = plan.identity;
  const StartPlan& sp = plan.start;
  // ---- made
  if (sp.overlay) TRY(make_overlay_dirs(*sp.overlay));
  Fd files;
  if (!sp.run_spec.files.empty()) {
    TRY_ASSIGN(Fd made, files_memfd(sp.run_spec));
    files = std::move(made);
  }
  t.incarnation++;
  t.state = TaskState::kStarting;
  t.pid = -1;
  phase("prepare");
  TRY_CTX(save(t), "record task");
  crash_point("run.recorded");
  phase("record");
  std::string dir = task_state_dir(t.id);
  TRY(dirs_.make(t.id));
  dirs_.exit_recorded(t.id);  // an earlier incarnation's, if any: not this one's
  if (sandbox) {
    // The sandbox's cgroup is the task's: only its limits are left to write.
    TRY_CTX(cgroups_->apply_limits(t.id, plan.limits.apply), "set the task's limits");
  } else {
    TRY_CTX(cgroups_->create_task(t.id, plan.limits.apply), "create cgroup");
    undo.made_cgroup();
  }
  crash_point("start.cgroup");
  TRY(fail_point("start.cgroup"));
  phase("cgroup");
  Fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd.valid()) return sys_error("open " + dir);
  if (sandbox) {
    // weft-init is there already, in the task's namespaces: it is handed the task (the
    // sandbox brought its loopback up while it waited).
    TRY(fail_point("start.handoff"));
    Status handed = hand_off(*sandbox, incarnation_argv(t, plan, /*lo_up=*/true), dirfd.get(),
                             files.valid() ? files.get() : -1);
    if (handed.ok()) {
      ++stats_.handoffs_;
      crash_point("start.spawned");
      phase("handoff");
      undo.done();
      return started(t, sandbox->pid, std::move(sandbox->pidfd), began_us, phase_us);
    }
    // Gone (killed, or the message did not fit): the usual start, with the same id.
    log_warn("a sandbox made ahead could not take the task; starting it the usual way",
             {{"TASK_ID", t.id}, {"ERROR", handed.error().str()}});
    undo.end_sandbox();
    TRY_CTX(cgroups_->create_task(t.id, plan.limits.apply), "create cgroup");
    undo.made_cgroup();
  }
  SpawnRequest req;
  req.init_path = cfg_.init_path;
  req.cgroup_dir = cgroups_->task_dir(t.id);
  req.task_dir_fd = dirfd.get();
  req.new_pid = t.spec.ns.pid;
  req.new_mount = t.spec.ns.mount;
  req.new_uts = t.spec.ns.uts;
  req.new_ipc = t.spec.ns.ipc;
  req.new_net = t.spec.ns.own_network();
  Fd netns;
  if (req.new_net) {
    TRY_ASSIGN(netns, net_.task_netns(t, plan.bridged));
    if (plan.bridged) phase("bridge");
    if (netns.valid()) {
      req.new_net = false;  // the child enters this one
      req.netns_fd = netns.get();
    }
  }
  req.init_argv = incarnation_argv(t, plan, netns.valid());
  req.files_fd = files.valid() ? files.get() : -1;
  TRY(fail_point("start.spawn"));
  TRY_ASSIGN(Spawned spawned, spawn_init(req));
  crash_point("start.spawned");
  phase("spawn");
  if (spawned.used == SpawnRequest::Mode::kFork && req.mode != SpawnRequest::Mode::kFork &&
      !warned_fork_start_) {
    warned_fork_start_ = true;
    log_warn(
        "clone3 into a cgroup is not available (a kernel older than 5.7, or a seccomp "
        "policy around the agent refuses it): tasks start by clone and a cgroup.procs "
        "write, about 15 ms slower each",
        {});
  }
  undo.done();
  return started(t, spawned.pid, std::move(spawned.pidfd), began_us, phase_us);
}

Status Manager::started(Task& t, pid_t pid, Fd pidfd, uint64_t began_us, uint64_t phase_us) {
  t.pid = pid;
  t.pidfd = std::move(pidfd);
  t.is_child = true;
  t.kill_sent = false;
  t.state = TaskState::kRunning;
  t.started_us = now_us();
  t.exit_code.reset();
  t.signal.reset();
  t.core_dumped = t.oom_killed = false;
  if (!t.stop_requested) t.reason.clear();
  Status saved = save(t);
  t.start_phases.emplace_back("record_running", now_monotonic_us() - phase_us);
  watch_init(t);
  checks_->start(t);
  if (!saved.ok())
    log_error("could not record running task", {{"TASK_ID", t.id}, {"ERROR", saved.error().str()}});
  log_info("task started", {{"TASK_ID", t.id},
                            {"TASK_NAME", t.name},
                            {"PID", std::to_string(t.pid)},
                            {"INCARNATION", std::to_string(t.incarnation)},
                            {"MONOTONIC_US", std::to_string(t.started_mono_us)}});
  stats_.start_seconds_.observe(static_cast<double>(now_us() - began_us) / 1e6);
  ++stats_.starts_;
  update_status();
  return {};
}

void Manager::watch_init(Task& t) {
  std::string id = t.id;
  auto src = loop_->add_io(t.pidfd.get(), EPOLLIN, [this, id](uint32_t) { on_init_exit(id); });
  if (src.ok()) {
    t.watch = std::move(src).value();
  } else {
    log_error("cannot watch task process", {{"TASK_ID", id}, {"ERROR", src.error().str()}});
  }
}

void Manager::on_init_exit(const std::string& id) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  Task& t = *it->second;
  t.watch.reset();
  std::optional<int> wait_status;
  if (t.is_child) {
    siginfo_t si;
    std::memset(&si, 0, sizeof si);
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(t.pidfd.get()), &si,
                 WEXITED | WNOHANG) == 0 &&
        si.si_pid != 0) {
      if (si.si_code == CLD_EXITED)
        wait_status = (si.si_status & 0xff) << 8;
      else
        wait_status = (si.si_status & 0x7f) | (si.si_code == CLD_DUMPED ? 0x80 : 0);
    }
  }
  std::optional<ExitRecord> rec;
  if (auto text = read_file(task_state_dir(id) + "/exit"); text.ok()) {
    rec = parse_exit_record(*text);
    if (rec && rec->incarnation != t.incarnation) rec.reset();
  }
  finish_incarnation(t, rec, wait_status);
}

void Manager::finish_incarnation(Task& t, const std::optional<ExitRecord>& rec,
                                 std::optional<int> init_status) {
  t.watch.reset();
  t.timer.reset();
  checks_->stop(t);
  // A fresh cgroup per incarnation: any oom_kill count is this incarnation's delta.
  bool oom = cgroups_->oom_kills(t.id).value_or(0) > 0;
  if (auto s = cgroups_->remove_task(t.id); !s.ok())
    log_error("could not remove task cgroup", {{"TASK_ID", t.id}, {"ERROR", s.error().str()}});
  crash_point("exit.cgroup-removed");
  t.pidfd.reset();
  t.pid = -1;
  t.finished_us = now_us();
  t.finished_mono_us = now_monotonic_us();

  ExitFacts facts;
  facts.record = rec;
  facts.init_status = init_status;
  facts.kill_sent = t.kill_sent;
  facts.oom_killed = oom;
  facts.stop_requested = t.stop_requested;
  facts.prior_reason = t.reason;
  facts.restarts = t.restarts;
  facts.backoff_us = t.backoff_us;
  facts.ran_us = t.finished_us - t.started_us;
  ExitOutcome out = decide_exit(facts, t.spec);
  t.kill_sent = false;
  t.exit_code = out.exit_code;
  t.signal = out.signal;
  t.core_dumped = out.core_dumped;
  t.oom_killed = out.oom_killed;
  t.reason = out.reason;
  if (!t.killed_for.empty())
    t.reason = "killed: " + std::exchange(t.killed_for, {}) + " (" + t.reason + ")";
  t.setup_failed = out.setup;
  t.state = out.state;
  if (out.oom_killed) ++stats_.oom_kills_;
  if (out.restart) {
    ++stats_.restarts_;
    t.backoff_us = out.backoff_us;
    t.next_start_us = t.finished_us + out.backoff_us;
    t.restarts++;
  }
  // The host's monotonic times of its start and end (task.show's *_monotonic_us) in the
  // log too: they outlive the record, which goes once the control plane has its end.
  log_info("task ended", {{"TASK_ID", t.id},
                          {"TASK_NAME", t.name},
                          {"STATE", task_state_name(t.state)},
                          {"REASON", t.reason},
                          {"MONOTONIC_US", std::to_string(t.finished_mono_us)}});
  if (auto s = save(t); !s.ok())
    log_error("could not record task exit", {{"TASK_ID", t.id}, {"ERROR", s.error().str()}});
  crash_point("exit.recorded");
  // The exit record has served its purpose only once the database holds it.
  dirs_.exit_recorded(t.id);
  if (t.state == TaskState::kBackoff) schedule_restart(t);
  if (t.terminal()) fetching_.release_image(t);
  update_status();
  // An exit is news at once (a replacement may wait on it), not in 20 ms with the starts.
  if (cp_calls_.cp_ && t.spec.owner == "controlplane") cp_calls_.cp_->report_now();
  if (t.terminal()) task_ended(t.id);
}

void Manager::schedule_restart(Task& t) {
  std::string id = t.id;
  // The stored time is the wall clock's (it outlives the agent): a wall clock stepped
  // back meanwhile would make the wait longer than the backoff, so it is at most that.
  int64_t delay =
      std::clamp<int64_t>(t.next_start_us - now_us(), 0, std::max<int64_t>(t.backoff_us, 0));
  auto src = loop_->add_timer_in(static_cast<uint64_t>(delay), [this, id] {
    auto it = tasks_.find(id);
    if (it == tasks_.end() || it->second->state != TaskState::kBackoff) return;
    Task& task = *it->second;
    task.timer.reset();
    Status s = start_incarnation(task);
    if (!s.ok()) {
      log_error("task restart failed", {{"TASK_ID", id}, {"ERROR", s.error().str()}});
      fail_task(task, "restart failed: " + s.error().str());
    }
  });
  if (src.ok()) t.timer = std::move(src).value();
}

void Manager::arm_stop_timer(Task& t) {
  std::string id = t.id;
  int64_t delay = std::max<int64_t>(0, t.stop_deadline_us - now_us());
  auto src =
      loop_->add_timer_in(static_cast<uint64_t>(delay), [this, id] { on_stop_deadline(id); });
  if (src.ok()) t.timer = std::move(src).value();
}

void Manager::on_stop_deadline(const std::string& id) {
  auto it = tasks_.find(id);
  if (it == tasks_.end() || it->second->state != TaskState::kStopping) return;
  log_info("grace period over; killing the task's cgroup", {{"TASK_ID", id}});
  it->second->kill_sent = true;
  if (auto s = cgroups_->kill_task(id); !s.ok())
    log_error("cgroup.kill failed", {{"TASK_ID", id}, {"ERROR", s.error().str()}});
}

void Manager::fail_task(Task& t, std::string reason) {
  t.state = TaskState::kFailed;
  t.reason = std::move(reason);
  t.finished_us = now_us();
  t.pid = -1;
  fetching_.release_image(t);
  if (auto st = save(t); !st.ok())
    log_error("could not record task", {{"TASK_ID", t.id}, {"ERROR", st.error().str()}});
  log_warn("task failed to start", {{"TASK_ID", t.id}, {"REASON", t.reason}});
  update_status();
  task_ended(t.id);
}

Status Manager::request_stop(Task& t, std::optional<uint64_t> grace_us) {
  if (t.terminal()) return {};
  if (t.state == TaskState::kBackoff || t.state == TaskState::kFetching) {
    // Nothing runs: stopped at once (a download goes on if another task waits for it).
    t.timer.reset();
    if (t.fetch_ticket) fetching_.images_->cancel(std::exchange(t.fetch_ticket, 0));
    t.stop_requested = true;
    t.state = TaskState::kStopped;
    t.finished_us = now_us();
    fetching_.release_image(t);
    TRY(save(t));
    update_status();
    task_ended(t.id);
    return {};
  }
  uint64_t grace = grace_us.value_or(t.spec.stop_grace_us);
  int64_t deadline = now_us() + static_cast<int64_t>(grace);
  if (t.state == TaskState::kStopping && deadline >= t.stop_deadline_us)
    return {};  // already on its way
  t.stop_requested = true;
  t.state = TaskState::kStopping;
  checks_->stop(t);
  t.stop_deadline_us = deadline;
  TRY(save(t));
  (void)cgroups_->freeze_task(t.id, false);  // a frozen task cannot act on its stop signal
  if (grace == 0 || !t.pidfd.valid() || !signal_pidfd(t.pidfd.get(), t.spec.stop_signal).ok()) {
    t.kill_sent = true;
    TRY(cgroups_->kill_task(t.id));
  }
  crash_point("stop.signalled");
  arm_stop_timer(t);
  return {};
}

}  // namespace weft::agent

namespace weft::agent {

std::vector<std::string> Manager::journal_fields(const Task& t) const {
  if (!cfg_.log_journald) return {};
  std::vector<std::string> f{"WEFT_TASK=" + t.spec.name, "WEFT_TASK_ID=" + t.id};
  if (t.spec.owner == "controlplane") {
    f.push_back("WEFT_JOB=" + t.spec.name.substr(0, t.spec.name.find('.')));
    if (!t.spec.entitlement.empty()) f.push_back("WEFT_ENTITLEMENT=" + t.spec.entitlement);
  }
  return f;
}

}  // namespace weft::agent
