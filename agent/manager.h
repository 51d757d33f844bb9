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
#include "agent/agent_metrics.h"
#include "agent/bridge.h"
#include "agent/cgroup.h"
#include "agent/cp_calls.h"
#include "agent/cp_session.h"
#include "agent/exec_sessions.h"
#include "agent/fetching.h"
#include "agent/image/service.h"
#include "agent/image_calls.h"
#include "agent/lifecycle.h"
#include "agent/local_discovery.h"
#include "agent/netns_pool.h"
#include "agent/readiness.h"
#include "agent/sandbox_pool.h"
#include "agent/start_plan.h"
#include "agent/task.h"
#include "agent/task_api.h"
#include "agent/task_checks.h"
#include "agent/task_dirs.h"
#include "agent/task_identities.h"
#include "agent/task_network.h"
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
  const rpc::Dispatcher& dispatcher() const { return api_.methods(); }

 private:
  // Its parts (each header says what it does); they reach the task table and the
  // lifecycle through it.
  friend class TaskApi;
  friend class TaskIdentities;
  friend class Fetching;
  friend class TaskNetwork;
  friend class AgentMetrics;
  friend class CpCalls;
  Manager(AgentConfig cfg, std::unique_ptr<CgroupFs> fs, std::unique_ptr<EventLoop> loop);

  // weft-init's journald fields for a task (agent.toml log_journald), or none.
  std::vector<std::string> journal_fields(const Task& t) const;
  // agent.toml's rules for what a spec may ask (agent/start_plan.h).
  const StartPolicy& start_policy() const { return start_policy_; }

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
  // The end of a start: weft-init (`pid`) runs in the task's cgroup; recorded running.
  Status started(Task& t, pid_t pid, Fd pidfd, uint64_t began_us, uint64_t phase_us);
  void fail_task(Task& t, std::string reason);
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
  void update_status();

  AgentConfig cfg_;
  // Made once from cfg_ (not copied at every start).
  const StartPolicy start_policy_{cfg_.volume_host_paths, cfg_.allow_unconfined_tasks};
  std::unique_ptr<CgroupFs> fs_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<CgroupTree> cgroups_;
  TaskApi api_{*this};
  TaskIdentities ids_{*this, cfg_};
  Fetching fetching_{*this};
  TaskNetwork net_{*this};
  AgentMetrics stats_{*this};
  CpCalls cp_calls_{*this};
  bool warned_fork_start_ = false;  // clone3 was unusable: logged once
  // The tasks' directories, recycled (agent/task_dirs.h), and their kept logs.
  TaskDirs dirs_{cfg_.state_dir, 256};
  // Sandboxes made ahead (agent/sandbox_pool.h); made at start(), after the cgroups.
  std::unique_ptr<SandboxPool> sandboxes_;
  std::unique_ptr<UsageSampler> usage_;
  std::unique_ptr<TaskStore> store_;
  std::unique_ptr<rpc::Server> server_;

  // start()'s parts: this host's cgroup tree, namespaces and bridge; the calls the
  // control plane's session makes of this agent.
  Status open_host();
  void make_checks();
  Status open_images();
  std::unique_ptr<HttpClient> http_;    // readiness checks over HTTP
  std::unique_ptr<Reaper> reaper_;      // exec checks abandoned mid-run
  std::unique_ptr<TaskChecks> checks_;  // readiness and liveness (task_checks.h)
  std::map<std::string, std::unique_ptr<Task>> tasks_;
  std::vector<Source> signals_;
  // task.wait's callers (agent/task_waiters.h), answered when their task ends or at
  // their deadline with wait_answer.
  std::unique_ptr<TaskWaiters> waiters_;
  void task_ended(const std::string& id) {
    if (waiters_) waiters_->ended(id);
  }
  // This boot: its id ("" when the kernel does not say), and whether it differs from the
  // one at the agent's last start (state_dir/boot_id): then the machine restarted, and
  // every task it ran died with it.
  struct Boot {
    std::string id;
    bool restarted = false;
  } boot_;
  std::string cgroup_mount_;
};

}  // namespace weft::agent
