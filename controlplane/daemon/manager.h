// weft-controlplane's composition root for the roles that hold machines: the all-in-one,
// a region's shard and a region's broker (a front end is region/front_end.h). It owns
// the event loop, the model (allocator, broker, scheduler), the state store and its group
// commit, the machines' sessions and the leader's clocks; it makes the features from them
// (each registers the calls it answers: machines/, entitlements/, jobs/, tasks/,
// maintenance/, discovery/, tend/, usage/, web/, region/, and its own status calls) and
// runs what only the leader does: the tick, the dead-machine watch and replacement.
//
// Machines open sessions (Unix or TCP) and register; commands for a machine (task.run,
// task.stop) go down its session as requests. Every mutation is written in one
// transaction before it is answered (Effects); after SIGKILL the state comes back and no
// task is restarted.
#pragma once

#include <memory>
#include <set>
#include <vector>

#include "common/event.h"
#include "common/metrics.h"
#include "controlplane/api/calls.h"
#include "controlplane/api/cp_metrics.h"
#include "controlplane/api/cp_server.h"
#include "controlplane/api/gate.h"
#include "controlplane/daemon/clocks.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/daemon/effects.h"
#include "controlplane/daemon/shard_parts.h"
#include "controlplane/daemon/status_calls.h"
#include "controlplane/discovery/calls.h"
#include "controlplane/entitlements/calls.h"
#include "controlplane/jobs/calls.h"
#include "controlplane/machines/calls.h"
#include "controlplane/machines/failure_budget.h"
#include "controlplane/maintenance/calls.h"
#include "controlplane/region/calls.h"
#include "controlplane/tasks/calls.h"
#include "controlplane/tasks/log_calls.h"
#include "controlplane/tend/calls.h"
#include "controlplane/usage/calls.h"
#include "controlplane/web/calls.h"

namespace weft::cp {

class Manager {
 public:
  static Result<std::unique_ptr<Manager>> create(CpConfig cfg);
  ~Manager();
  Status start();
  Status run();
  // For harnesses that drive the loop themselves (fuzz/fuzz_cp_dispatch.cc).
  EventLoop& loop() { return *loop_; }

 private:
  Manager(CpConfig cfg, std::unique_ptr<EventLoop> loop);
  // Writes go in groups (store/group_commit.h): nothing is sent before the group that
  // wrote it commits. Made with the store.
  void use_store(std::unique_ptr<StateStore> store);
  static constexpr uint64_t kMaxBatchUs = 20'000;
  // Start-up: the state read into the modules, the sockets and the features' calls, and
  // the leader's own work (ticks, heartbeat checks, TaskControl, autoscaling, the
  // ReBalancer, the region's parts).
  Status restore_state();
  Status serve();
  void lead();
  // Replicas on etcd (docs/replicas.md): follow (refusing calls with the leader's
  // address) until the election is won, then restore and lead; stop when it is lost.
  Status start_replica();
  void step_down(const std::string& why) { replica_.step_down(why); }
  // TaskControl (docs/taskcontrol.md): links to the jobs' controllers, kept in step with
  // the jobs every second; each controlled job's plan asked every second and on change.
  void start_task_control();

  // The leader's tick: machines that went down, came up or did not prepare, the
  // replacements the failure budget allows, profile rolls, the scheduler's own tick,
  // periodic runs and the pruning of ended tasks; then one write and the commands.
  void tick();
  void watch_heartbeats();  // the dead-machine check (Clocks: every quarter interval)
  // Machines dead by their heartbeats at `now`. A look that comes more than a heartbeat
  // interval after the last one means this loop was held up (a slow etcd write, the
  // process paused): that time is not counted against the machines.
  std::vector<MachineId> check_machines(uint64_t now);
  // Hands machines that went down to the scheduler within the failure budget (in fault
  // domains) unless the circuit breaker is open (cp_conf.h).
  void replace_down_machines(uint64_t now, std::vector<Command>* cmds,
                             std::set<MachineId>* touched);
  // Why machine `m` has not applied its entitlement's profile (a take_unprepared).
  std::string prepare_failure(MachineId m) const;
  // Prometheus /metrics (docs/metrics.md).
  void register_metrics();
  // Ended tasks prune() looks at per tick.
  static constexpr size_t kPruneBudget = 20000;

  CpConfig cfg_;
  std::unique_ptr<EventLoop> loop_;
  CpServer server_{*loop_};  // closed first by ~Manager: its sessions reach the state
  ReplicaRole replica_;      // the election, when replicated (replica_role.h)
  Clocks clocks_;            // when the leader's rounds run (clocks.h)
  // The model, and what the machines' daemons keep open and said last.
  Allocator alloc_;
  Broker broker_;
  Scheduler sched_;
  MachineSessions sessions_;
  MachineReports reports_;    // what the machines' daemons said last (machine.show)
  PoolChanges pool_changes_;  // machines whose profile and readiness are looked at again
  // Features' state that the leader's rounds move on too.
  struct Rounds {
    // What the features keep for the next leader (store/notes.h), written with the state;
    // first: the features after it hold it.
    Notes notes;
    ProfileRolls profile_rolls;
    Maintenance maintenance;
    JobEvents job_events;
    PeriodicRuns periodic;
    // Machines that went down wait for the failure budget, and the circuit breaker
    // (machines/failure_budget.h).
    FailureBudget failures;
  } rounds_;
  // The store and its group commit, and the audit log (made with the store).
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<GroupCommit> group_;  // after the loop and the store: goes before them
  std::unique_ptr<AuditLog> audit_;
  std::shared_ptr<const SecretBox> secrets_;  // secrets_key: jobs' secrets sealed at rest
  CpMetrics metrics_;
  // Parts made as this control plane serves and leads.
  struct Leading {
    std::unique_ptr<Discovery> discovery;
    std::unique_ptr<LogRelay> log_relay;
    std::unique_ptr<AgentAsks> agent_asks;
    std::unique_ptr<ExecRelay> exec_relay;
    std::unique_ptr<UsageGlance> usage_glance;
    std::unique_ptr<ControlRounds> control;
  } leading_;
  RegionParts region_;
  Model model_;  // the model and the machines' links above, as every feature sees them
  // Who may call, the one path from a decision to its effects, and the calls' table.
  Gate gate_;
  Effects fx_;
  std::unique_ptr<Calls> calls_;  // made as it serves (the store known)
  // The features, each holding the calls it answers.
  struct Features {
    explicit Features(const ShardParts& s);
    MachineCalls machines;
    EntitlementCalls entitlements;
    JobCalls jobs;
    TaskCalls tasks;
    LogCalls logs;
    MaintenanceCalls maintenance;
    DiscoveryCalls discovery;
    TendCalls tend;
    UsageCalls usage;
    WebCalls web;
    StatusCalls status;
    RegionCalls region;
  };
  std::unique_ptr<Features> features_;
};

}  // namespace weft::cp
