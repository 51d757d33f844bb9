// The control plane's side of this agent: its session (agent/cp_session.h), the calls the
// control plane makes of the agent on it (task.run, stop, logs, show, kill, exec, usage,
// image.pull, report.*, service.update), the exec sessions those calls open, and the
// copy of the region's endpoints this machine answers DNS from. The calls reach only the
// control plane's own tasks; the session was authenticated when it connected.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "agent/cp_session.h"
#include "agent/exec_sessions.h"
#include "agent/local_discovery.h"
#include "agent/machine_lease.h"
#include "common/event.h"
#include "common/result.h"
#include "common/rpc/session.h"

namespace weft::agent {

class Manager;
struct Task;

class CpCalls {
 public:
  explicit CpCalls(Manager& m) : m_(m) {}
  // Drops the ended control-plane tasks a machine.report reply names (by name): their
  // rows, state directories and logs, so neither reports nor the agent's state grow
  // with every task ever run.
  void forget_ended(const std::set<std::string>& names);
  // The session to the control plane (agent/cp_session.h), when agent.toml names one;
  // its calls (add_cp_methods: task.run, task.stop and the rest) arrive on it.
  Status cp_start();
  Status add_cp_methods();
  // The session (null: none, or not made yet).
  CpSession* session() const { return cp_.get(); }
  // The machine's lease (agent/machine_lease.h), as this agent counts it.
  const MachineLease& lease() const { return lease_; }

 private:
  friend class Manager;
  friend class TaskApi;
  friend class AgentMetrics;
  Manager& m_;
  std::unique_ptr<CpSession> cp_;
  // `weftctl task exec` (agent/exec_sessions.h): commands joined to the control plane's
  // tasks, their bytes over its session. cp_exec plans one (the task running, its
  // identity, a cgroup of its own).
  std::unique_ptr<ExecSessions> execs_;
  rpc::Dispatcher cp_methods_;
  // Service discovery (docs/services.md): the copy of the endpoints, the DNS answers
  // from it and the jobs asked for.
  std::unique_ptr<LocalDiscovery> discovery_;

  // The lease: its terms from machine.register's reply, renewed by every answer; kept in
  // state_dir/lease for a restarted agent (read by cp_start). At fence_at the tasks of
  // at-most-one jobs are stopped (fence_now).
  void lease_terms(const nlohmann::json& reply);
  void lease_renewed(uint64_t sent_us);
  void recover_lease();
  void arm_fence();
  void fence_now();
  // A task of an at-most-one job that is still alive here.
  static bool fenceable(const Task& t);
  MachineLease lease_;
  Source fence_timer_;
  bool fenced_logged_ = false;  // this fencing's warning was logged
};

}  // namespace weft::agent
