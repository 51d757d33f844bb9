// The agent's manager: owns the event loop, the task table (sqlite, in memory), the
// cgroup tree and the local API. One thread; every callback runs on the loop.
//
// Task lifecycle (states as reported by task.ls):
//
//   starting -> running -> (stopping) -> exited | failed | stopped
//                  \-> backoff -> starting ...   (restart policy)
//
// Each state change is committed to sqlite before the side effect that depends on it,
// and every step can be reconstructed from the database plus the cgroup tree plus the
// exit record weft-init leaves, which is what recover() does after a crash.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/agent_conf.h"
#include "agent/bridge.h"
#include "agent/cgroup.h"
#include "agent/cp_session.h"
#include "agent/exec_sessions.h"
#include "agent/image/service.h"
#include "agent/image_calls.h"
#include "agent/lifecycle.h"
#include "agent/local_discovery.h"
#include "agent/netns_pool.h"
#include "agent/readiness.h"
#include "agent/sandbox_pool.h"
#include "agent/start_plan.h"
#include "agent/task.h"
#include "agent/task_checks.h"
#include "agent/task_dirs.h"
#include "agent/task_store.h"
#include "agent/task_waiters.h"
#include "agent/usage.h"
#include "common/cp_link.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/http_client.h"
#include "common/metrics.h"
#include "common/rpc/server.h"
#include "common/store.h"
#include "common/task_spec.h"

namespace weft::agent {

class Manager {
 public:
  // `fs` is the cgroup filesystem (real in production).
  static Result<std::unique_ptr<Manager>> create(AgentConfig cfg, std::unique_ptr<CgroupFs> fs);
  ~Manager();

  // Opens state, sets up cgroups, reconciles with the cgroup tree, binds the socket.
  Status start();
  Status run();
  EventLoop& loop() { return *loop_; }
  const AgentConfig& config() const { return cfg_; }
  const rpc::Dispatcher& dispatcher() const { return methods_; }

 private:
  Manager(AgentConfig cfg, std::unique_ptr<CgroupFs> fs, std::unique_ptr<EventLoop> loop);

  void register_methods();
  // The API (api.cc): one handler per method, listed in register_methods' table.
  Result<nlohmann::json> api_agent_info(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_run(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_stop(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_kill(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_freeze(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_thaw(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_logs(const nlohmann::json& p, const rpc::CallContext& c);
  // The control plane's task.logs: only its own tasks, named as it named them; those it
  // had the agent forget, from ended-logs/ (TaskDirs::keep_logs).
  Result<nlohmann::json> cp_task_logs(const nlohmann::json& p, const rpc::CallContext& c);
  // The control plane's task by the name it gave it: the live one, else the newest (null
  // when this machine has none; never an operator's local task).
  Task* cp_task(const std::string& name);
  // task.show and task.kill (a signal) of the control plane's own tasks, by name: what
  // `weftctl task show|signal|kill --cluster` reach through the control plane, which
  // checks the caller and hides secrets.
  Result<nlohmann::json> cp_task_show(const nlohmann::json& p);
  Result<nlohmann::json> cp_task_kill(const nlohmann::json& p, const rpc::CallContext& c);
  // task.usage (common/task_usage.h): tasks named as their owner named them; the control
  // plane's only its own.
  Result<nlohmann::json> task_usage(const nlohmann::json& p, const rpc::CallContext& c,
                                    bool control_plane_only);
  Result<nlohmann::json> api_task_usage(const nlohmann::json& p, const rpc::CallContext& c);
  // weft-init's journald fields for a task (agent.toml log_journald), or none.
  std::vector<std::string> journal_fields(const Task& t) const;
  Result<nlohmann::json> api_task_remove(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_wait(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> freeze_task(const nlohmann::json& p, bool freeze);
  // task.run and task.stop: from the local API (after its privilege check) and from the
  // control plane's session (authenticated when it connected), which marks its tasks.
  Result<nlohmann::json> run_task(nlohmann::json params, bool for_control_plane);
  Result<nlohmann::json> stop_task(const nlohmann::json& params);
  Status check_privileged(const rpc::Peer& peer) const;
  // agent.toml's rules for what a spec may ask (agent/start_plan.h).
  const StartPolicy& start_policy() const { return start_policy_; }
  Result<Task*> find_task(const nlohmann::json& params);

  // Lifecycle.
  Result<Task*> create_task(TaskSpec spec);
  // A task that never started (its first start failed): its row, directory, image hold
  // and entry go, as if it had not been asked for.
  void forget_unstarted(const std::string& id);
  // Everything an incarnation's start decides before it makes anything: every refusal
  // (limits, the spec under the machine's policy, identity, bridge) comes from here with
  // nothing made; what it holds for the task (its own uid, its bridge address) is the
  // task's until it is removed, as at any start.
  Result<IncarnationPlan> plan_incarnation(Task& t);
  // Carries the plan out: records the task "starting", then makes its directory, cgroup,
  // network namespace and weft-init. On a failure part-way, one undo path (StartUndo in
  // manager.cc) unmakes what this start made, newest first. With `sandbox` (the task's
  // first start, the sandbox whose id it has), the task is handed to that weft-init
  // instead of a new one; it is used up either way.
  Status start_incarnation(Task& t, Sandbox* sandbox = nullptr);
  // weft-init's arguments for this incarnation (`lo_up`: its loopback is up already).
  std::vector<std::string> incarnation_argv(const Task& t, const IncarnationPlan& plan,
                                            bool lo_up) const;
  // The network namespace a task with one of its own enters: one made ahead (NetnsPool)
  // or, for a bridge task, one made now and plugged into the bridge; an invalid Fd when
  // none is ready for a task without a bridge (the child then makes its own).
  Result<Fd> task_netns(Task& t, bool bridged);
  // The end of a start: weft-init (`pid`) runs in the task's cgroup; recorded running.
  Status started(Task& t, pid_t pid, Fd pidfd, uint64_t began_us, uint64_t phase_us);
  // Image and package tasks: fetching until the image and the package are local (one
  // after the other), then started (or failed with the reason); holds their layers
  // while the task may run. have_local() takes hold of what is here already and says
  // whether anything is missing.
  bool have_local(Task& t);
  void begin_fetch(Task& t);
  void on_fetched(const std::string& id, bool package, Result<image::LocalImage> img);
  void fail_task(Task& t, std::string reason);
  void release_image(Task& t);
  void watch_init(Task& t);
  void on_init_exit(const std::string& id);
  void finish_incarnation(Task& t, const std::optional<ExitRecord>& rec,
                          std::optional<int> wait_status);
  void schedule_restart(Task& t);
  void arm_stop_timer(Task& t);
  void on_stop_deadline(const std::string& id);
  Status request_stop(Task& t, std::optional<uint64_t> grace_us);
  // Recovery.
  Status load_tasks();
  void recover();
  void adopt_or_collect(Task& t);
  int find_init_pid(const std::string& id);

  // Persistence.
  Status save(const Task& t);
  Status erase(const std::string& id);

  std::string task_state_dir(const std::string& id) const { return dirs_.path(id); }
  std::string cgroup_rel(const std::string& id) const;
  nlohmann::json summary(const Task& t) const;
  nlohmann::json detail(Task& t);
  void update_status();

  AgentConfig cfg_;
  // Made once from cfg_ (not copied at every start).
  const StartPolicy start_policy_{cfg_.volume_host_paths, cfg_.allow_unconfined_tasks};
  std::unique_ptr<CgroupFs> fs_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<CgroupTree> cgroups_;
  std::unique_ptr<NetnsPool> netns_pool_;
  bool netns_pool_failure_logged_ = false;
  bool warned_fork_start_ = false;  // clone3 was unusable: logged once
  // The tasks' directories, recycled (agent/task_dirs.h), and their kept logs.
  TaskDirs dirs_{cfg_.state_dir, 256};
  // Sandboxes made ahead (agent/sandbox_pool.h); made at start(), after the cgroups.
  std::unique_ptr<SandboxPool> sandboxes_;
  std::unique_ptr<UsageSampler> usage_;
  std::unique_ptr<TaskStore> store_;
  std::unique_ptr<image::Service> images_;
  std::unique_ptr<ImageCalls> image_calls_;  // image.* (image_calls.h)
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Server> server_;

  // Drops the ended control-plane tasks a machine.report reply names (by name): their
  // rows, state directories and logs, so neither reports nor the agent's state grow
  // with every task ever run.
  void forget_ended(const std::set<std::string>& names);
  // The session to the control plane (agent/cp_session.h), when cfg_.control_plane is
  // set; task.run and task.stop arrive on it through cp_methods_.
  Status cp_start();
  // start()'s parts: this host's cgroup tree, namespaces and bridge; the calls the
  // control plane's session makes of this agent.
  Status open_host();
  Status add_cp_methods();
  std::unique_ptr<CpSession> cp_;
  std::unique_ptr<HttpClient> http_;    // readiness checks over HTTP
  std::unique_ptr<Reaper> reaper_;      // exec checks abandoned mid-run
  std::unique_ptr<TaskChecks> checks_;  // readiness and liveness (task_checks.h)
  // `weftctl task exec` (agent/exec_sessions.h): commands joined to the control plane's
  // tasks, their bytes over its session. cp_exec plans one (the task running, its
  // identity, a cgroup of its own).
  std::unique_ptr<ExecSessions> execs_;
  Result<nlohmann::json> cp_exec(const nlohmann::json& p, const rpc::CallContext& c);
  // Prometheus /metrics (docs/metrics.md).
  void register_metrics();
  metrics::Registry metrics_;
  std::unique_ptr<metrics::HttpServer> metrics_http_;
  metrics::Histogram start_seconds_;
  uint64_t starts_ = 0, restarts_ = 0, oom_kills_ = 0;
  uint64_t handoffs_ = 0;  // starts that took a sandbox
  rpc::Dispatcher cp_methods_;
  std::map<std::string, std::unique_ptr<Task>> tasks_;
  std::vector<Source> signals_;
  // task.wait's callers (agent/task_waiters.h), answered when their task ends or at
  // their deadline with wait_answer.
  std::unique_ptr<TaskWaiters> waiters_;
  Result<nlohmann::json> wait_answer(const std::string& id, bool remove);
  void task_ended(const std::string& id) {
    if (waiters_) waiters_->ended(id);
  }
  // The kernel's boot id at the agent's last start (state_dir/boot_id): another one now
  // means the machine restarted, and every task it ran died with it.
  bool machine_restarted_ = false;
  int weft_gid_ = -1;
  // Tasks' own uids (agent.toml task_uids), handed out in turn (agent/range_pool.h).
  RangePool own_uids_{static_cast<uint64_t>(cfg_.task_uid_first),
                      static_cast<uint64_t>(cfg_.task_uid_last)};
  // The identity `t` runs as under `spec` (its spec with its image's defaults): a uid of
  // its own unless the spec, the image or agent.toml names a user; never the sockets'
  // group, root only where allow_root_tasks. Takes the task's own uid if it has none yet
  // (`t` null: only checks, as create_task does before the task exists).
  Result<Identity> identity_of(Task* t, const TaskSpec& spec,
                               const std::vector<std::string>* image_roots = nullptr);
  void release_own_uid(const std::string& id);
  // The machine's bridge (agent.toml [bridge]; null: none, or it could not be made, and
  // why). publish_bridge() makes its table publish exactly the live bridge tasks' ports.
  std::unique_ptr<Bridge> bridge_;
  std::string bridge_failure_;
  void publish_bridge();
  // namespaces.network "own" made "bridge" or "private" for this machine; a bridge task
  // refused where there is no bridge.
  Status resolve_network(TaskSpec* spec) const;
  Status refuse_without_bridge(const TaskSpec& spec) const;
  std::string cgroup_mount_;
  uint64_t started_at_us_ = 0;
  // Service discovery (docs/services.md): the copy of the endpoints, the DNS answers
  // from it and the jobs asked for; where the search for a free port of port_range
  // starts (in turn, as for uids).
  std::unique_ptr<LocalDiscovery> discovery_;
  uint16_t next_port_ = 0;
  // Gives the spec's ports their numbers (a 0 a free port of port_range), refusing one
  // another live task holds; WEFT_PORT_<NAME> in its environment.
  Status assign_ports(TaskSpec* spec);
};

}  // namespace weft::agent
