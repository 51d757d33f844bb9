// weft-controlplane's manager: one sd-event loop holding the allocator, broker and
// scheduler, with their state in a store (sqlite, or etcd for replicas: state_store.h,
// etcd_store.h). Machines open sessions (Unix or TCP) and
// register; commands for a machine (task.run, task.stop) go down its session as
// requests. Operators use the same protocol on the Unix socket (weftctl). Every
// mutation is written in one transaction before it is answered; after SIGKILL the
// state comes back and no task is restarted.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "common/event.h"
#include "common/metrics.h"
#include "common/registry.h"
#include "common/rpc/client.h"
#include "common/rpc/server.h"
#include "common/task_report.h"
#include "controlplane/api/audit_log.h"
#include "controlplane/api/cp_metrics.h"
#include "controlplane/api/cp_server.h"
#include "controlplane/daemon/clocks.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/discovery/discovery.h"
#include "controlplane/discovery/region_services.h"
#include "controlplane/discovery/service_table.h"
#include "controlplane/entitlements/profile_rolls.h"
#include "controlplane/jobs/job_events.h"
#include "controlplane/jobs/periodic.h"
#include "controlplane/machines/broker.h"
#include "controlplane/machines/failure_budget.h"
#include "controlplane/machines/machine_links.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/region/checks.h"
#include "controlplane/region/lending.h"
#include "controlplane/region/shard_moves.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/etcd_store.h"
#include "controlplane/store/group_commit.h"
#include "controlplane/store/leader.h"
#include "controlplane/store/replica_role.h"
#include "controlplane/store/state_store.h"
#include "controlplane/taskcontrol/control_rounds.h"
#include "controlplane/taskcontrol/links.h"
#include "controlplane/tasks/exec_relay.h"
#include "controlplane/tasks/log_relay.h"
#include "controlplane/tend/autoscale_rounds.h"
#include "controlplane/tend/rebalancer.h"
#include "controlplane/usage/usage_glance.h"

namespace weft::cp {

// A machine's daemons speak for their own machine only: over TLS the certificate must
// name `machine` (a SAN DNS entry or the CN); otherwise kPermissionDenied, logged. Unix
// and plaintext sessions (tests, insecure_listen) are not bound.
Status check_machine_identity(const rpc::Peer& peer, const std::string& machine);

// Shared by manager.cc and api.cc.
uint64_t now_us();  // the scheduler's and broker's steady clock
nlohmann::json task_json(const TaskRecord& t, const Allocator& a);

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
  void register_methods();
  // The API (api.cc): one handler per method.
  Result<nlohmann::json> api_machine_register(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_heartbeat(const nlohmann::json& p, const rpc::CallContext& c);
  // machine.report, read without a document (rpc::Dispatcher::add_raw): `report` as
  // weft::parse_task_report read it, or why not, from `machine`.
  Result<nlohmann::json> api_machine_report(const std::string& machine,
                                            Result<weft::TaskReport> report,
                                            const rpc::CallContext& c);
  Result<nlohmann::json> api_health_report(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_report(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_entitlement_create(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_entitlement_update(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_audit_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_controlplane_status(const nlohmann::json& p,
                                                 const rpc::CallContext& c);
  // A call a region's front end carried for an operator (region_api.cc): run as that
  // operator's, audited with their name.
  Result<nlohmann::json> api_frontend_forward(const nlohmann::json& p, const rpc::CallContext& c);
  // A region's brokers and shards lend machines (lending.h, region_api.cc).
  Result<nlohmann::json> api_pool_lend(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_pool_return(const nlohmann::json& p, const rpc::CallContext& c);
  // A front end moves an entitlement between shards (entitlement_moves.h).
  Result<nlohmann::json> api_region_move(const nlohmann::json& p, const rpc::CallContext& c);
  // Whether the caller is one of the region's front ends (a certificate matching
  // access.front_end, or an admin on this host's Unix socket); logs a refusal.
  bool front_end_call(const rpc::CallContext& c, const char* method) const;
  // Whether the caller may act for the shard `p` names (its certificate, or this host).
  Result<std::string> calling_shard(const nlohmann::json& p, const rpc::CallContext& c) const;
  // The region's parts of a broker or shard (lending, services across shards).
  Status start_region();
  // A broker's lending, or a shard's with brokers; a shard's services across the region
  // and its side of entitlements' moves.
  struct RegionParts {
    std::unique_ptr<Lending> lending;
    std::unique_ptr<RegionServices> services;
    // A shard's checks of the front ends' word against etcd (before `moves`, which
    // uses it: destroyed after it).
    std::unique_ptr<RegionChecks> checks;
    std::unique_ptr<EntitlementMoves> moves;
  } region_;
  // entitlement.create's work once its spec is read (and, on a shard, its home checked).
  Result<nlohmann::json> create_entitlement(const EntitlementSpec& e);
  // A shard's moves under way, read at the start of its term (restore_state).
  Status load_moves();
  // machine.rm's work: the machine is listed no more (its registering brings it back).
  // `left_for`: it went, alive, to another control plane of the region (why, logged).
  Status forget_machine(MachineId m, const char* left_for = nullptr);
  std::string advertised() const {
    return !cfg_.store.advertise.empty() ? cfg_.store.advertise : cfg_.listen;
  }
  Result<nlohmann::json> api_entitlement_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_entitlement_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_create(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> job_create_resolved(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> job_update_resolved(const nlohmann::json& p, const rpc::CallContext& c);
  // A job whose task names its image by tag alone: the tag is resolved to a digest at
  // the registry first (the call is answered once that is done, without blocking the
  // loop), so every task of the generation runs the same bytes; then `next` runs with
  // task.image = "<ref>@<digest>".
  using JobCall = Result<nlohmann::json> (Manager::*)(const nlohmann::json&,
                                                      const rpc::CallContext&);
  Result<nlohmann::json> resolve_image_then(const nlohmann::json& p, const rpc::CallContext& c,
                                            JobCall next);
  std::unique_ptr<registry::Client> registry_;
  Result<nlohmann::json> api_job_scale(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_update(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_stop(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_drain(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_rm(const nlohmann::json& p, const rpc::CallContext& c);
  // Planned maintenance (controlplane/maintenance/maintenance.h, docs/maintenance.md).
  Result<nlohmann::json> api_maintenance_schedule(const nlohmann::json& p,
                                                  const rpc::CallContext& c);
  Result<nlohmann::json> api_maintenance_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_maintenance_cancel(const nlohmann::json& p, const rpc::CallContext& c);
  // Moves the events on (every second, and at once after a change); what they drain,
  // stop and undrain is written and sent like any other change.
  void maintenance_round();
  Maintenance::World maintenance_world(std::vector<Command>* cmds, std::set<MachineId>* touched);
  Maintenance maintenance_;
  // job.scale, job.update and job.stop: the operation, persisted, then sent.
  Result<nlohmann::json> job_op(const std::string& op, const nlohmann::json& p,
                                const rpc::CallContext& c, const std::string& note = "");
  // Sends commands down the machines' sessions; a stop of a task that just left service
  // discovery waits for the agents first (refresh_services).
  void send(const std::vector<Command>& cmds);
  void dispatch(const std::vector<Command>& cmds);  // at once
  void tick();
  void watch_heartbeats();  // the dead-machine check (Rounds: every quarter interval)
  // Machines dead by their heartbeats at `now`. A look that comes more than a heartbeat
  // interval after the last one means this loop was held up (a slow etcd write, the
  // process paused): that time is not counted against the machines.
  std::vector<MachineId> check_machines(uint64_t now);
  // A tick soon (next loop iteration), once however many changes ask for it: what a
  // machine's new verdict or profile needs, without a tick per report.
  void kick() { clocks_.kick(); }
  // Hands machines that went down to the scheduler within the failure budget (in fault
  // domains) unless the circuit breaker is open (cp_conf.h).
  void replace_down_machines(uint64_t now, std::vector<Command>* cmds,
                             std::set<MachineId>* touched);
  // A machine answered a rolling update's prefetch: its old tasks may roll.
  void prefetched(const std::string& job, uint64_t generation, MachineId m);
  // A machine refused a task.run: the task fails now, with the machine's message.
  void start_refused(const std::string& task, const Error& e, bool bad_spec);
  // Writes what changed for these jobs and machines (and everything else small).
  Status persist(const std::set<std::string>& jobs, const std::set<MachineId>& machines);
  // Writes go in groups (controlplane/store/group_commit.h): nothing is sent before the group
  // that wrote it commits. Made with the store.
  void use_store(std::unique_ptr<StateStore> store);
  static constexpr uint64_t kMaxBatchUs = 20'000;
  // Who called (access.h), and whether that caller may make a call of this level.
  Caller caller(const rpc::CallContext& c) const;
  Status permit(const Caller& who, int access, const std::string& method) const;
  // Job operations in entitlement `e`: its owners and admins (kPermissionDenied).
  Status may_change_jobs(const Caller& who, EntitlementId e) const;
  // The audit log (audit_log.h): one entry per operator call, made with the store.
  void audit(const Caller& who, const std::string& method, const nlohmann::json& p,
             const Result<nlohmann::json>& r) {
    audit_->call(who, method, p, r);
  }
  std::unique_ptr<AuditLog> audit_;
  // What a job's TaskController (often a task) made the control plane do, in the name
  // of the operator who last created or updated the job.
  void audit_controller(const std::string& job, const std::vector<std::string>& acks,
                        const std::vector<Command>& done);
  // A machine's agent or sidekick session (machine_links.h).
  Status claim_session(MachineSessions::Daemon d, MachineId m, const rpc::CallContext& c,
                       uint64_t interval_us = 0) {
    return sessions_.claim(d, m, alloc_.spec(m).name, c, interval_us);
  }
  // Sidekick and hcs report on change, and otherwise every keepalive (5 heartbeats).
  uint64_t keepalive_us() const { return 5 * cfg_.broker.heartbeat_interval_us; }
  Result<MachineId> machine_of(const nlohmann::json& p, const rpc::CallContext& c);
  // machine_of for a machine's own calls (register aside): the session must be allowed to
  // speak for it (check_machine_identity).
  Result<MachineId> own_machine(const nlohmann::json& p, const rpc::CallContext& c);
  Result<MachineId> own_machine(const std::string& id, const rpc::CallContext& c);
  // A job file's JSON with its entitlement named: the spec with the entitlement's id.
  Result<JobSpec> job_from_params(const nlohmann::json& p) const;
  nlohmann::json machine_json(MachineId m) const;
  // TaskControl (docs/taskcontrol.md): links to the jobs' controllers, kept in step with
  // the jobs every second; each controlled job's plan asked every second and on change.
  void start_task_control();
  // The address of a controller named by its job (task_controller.job): its first ready
  // task's machine (the agent session's address) and the port; "" when none is ready.
  std::string controller_address(const TaskControllerSpec& c) const;
  // Writes and sends what a scheduler call outside a request produced.
  void apply_commands(const std::vector<Command>& cmds);
  std::unique_ptr<ControlRounds> control_;  // control_rounds.h
  // Tells each connected sidekick whose machine's desired profile changed (a machine
  // joined or left an entitlement) to apply it now, rather than at its next report.
  void push_profiles() { pool_changes_.push(sessions_, broker_, alloc_); }

  // The read-only web view (web_api.cc, web_view.h, docs/web-view.md).
  Result<nlohmann::json> api_web_page(const nlohmann::json& p, const rpc::CallContext& c);
  std::string web_page() const;

  // Capacity that changes (capacity_api.cc, docs/entitlements.md).
  Result<nlohmann::json> api_entitlement_rm(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_assign(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_machine_release(const nlohmann::json& p, const rpc::CallContext& c);
  // A new quota may not leave out the machines that run its tasks or were assigned.
  Status check_quota(EntitlementId e, size_t quota) const;
  Status check_profile(const std::string& profile) const;
  // Profile rolls (controlplane/entitlements/profile_rolls.h): every tick, the machines released
  // tell their sidekicks and take no new tasks until they applied the new profile.
  void advance_profile_rolls();
  nlohmann::json profile_roll_json(EntitlementId e) const;

  // Task logs read through the machines' sessions (logs_api.cc, docs/logs.md).
  Result<nlohmann::json> api_task_logs(const nlohmann::json& p, const rpc::CallContext& c);
  // Admins, owners of the entitlement, certificates matching access.logs.
  bool may_read_logs(const Caller& who, EntitlementId e) const;
  std::string machine_name(MachineId m) const;
  std::unique_ptr<LogRelay> log_relay_;  // the reads in flight and their bounds (serve())

  // Service discovery (discovery.h; the methods in services_api.cc; docs/services.md),
  // and a shard's across its region (region_services.h).
  Result<nlohmann::json> api_service_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_service_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_service_watch(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_service_interest(const nlohmann::json& p, const rpc::CallContext& c);
  std::unique_ptr<Discovery> discovery_;
  // Autoscaling (autoscaling.h): the leader's rounds; job.autoscale shows and pauses it.
  Result<nlohmann::json> api_job_autoscale(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_autoscale_pause(const nlohmann::json& p,
                                                 const rpc::CallContext& c);
  void start_autoscaling();
  std::unique_ptr<AutoscaleRounds> autoscaling_;
  // What tasks use, asked of the agents (agent_asks.h): autoscaling's rounds and `top`
  // (top.h, weftctl top).
  Result<nlohmann::json> api_top(const nlohmann::json& p, const rpc::CallContext& c);
  // One task's operations through the control plane (task_ops_api.cc).
  Result<const TaskRecord*> task_for_operation(const nlohmann::json& p) const;
  Result<nlohmann::json> api_task_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_signal(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_restart(const nlohmann::json& p, const rpc::CallContext& c);
  // A command inside a running task (`weftctl task exec`), carried by exec_relay_.
  Result<nlohmann::json> api_task_exec(const nlohmann::json& p, const rpc::CallContext& c);
  std::unique_ptr<ExecRelay> exec_relay_;
  // The web view's "what tasks use" (usage_glance.h): top's figures, asked in the
  // background while pages are looked at.
  std::unique_ptr<UsageGlance> usage_glance_;
  // A machine's task failed its liveness check (task.unhealthy, from its agent).
  Result<nlohmann::json> api_task_unhealthy(const nlohmann::json& p, const rpc::CallContext& c);
  std::unique_ptr<AgentAsks> agent_asks_;
  // A job's events (job_events.h): the scheduler's, taken after every batch and tick.
  Result<nlohmann::json> api_job_events(const nlohmann::json& p, const rpc::CallContext& c);
  void take_events();
  JobEvents job_events_;
  // Periodic jobs' runs, started at the tick (periodic.h); a batch or periodic job's
  // part of job.show and job.ls.
  PeriodicRuns periodic_;
  // Rollouts (docs/jobs.md "Rollouts"): a job's revisions, a revert to one (a rolling
  // update to its spec, without canaries), pause, resume, abort and promote.
  Result<nlohmann::json> api_job_history(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_revert(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_job_rollout(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> revert_to(const std::string& name, uint64_t generation,
                                   const std::string& note, const rpc::CallContext& c);
  nlohmann::json batch_json(const std::string& job, const JobSpec& spec);
  // The ReBalancer (rebalancer.h): the plan for an entitlement now (what it would move),
  // the leader's loop that carries plans out, its status and pause.
  Result<nlohmann::json> api_rebalance_plan(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_rebalance_status(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_rebalance_pause(const nlohmann::json& p, const rpc::CallContext& c);
  void start_rebalancer();
  std::unique_ptr<Rebalancer> rebalancer_;

  // Start-up pieces: the state read into the modules, the sockets and methods, and the
  // leader's own work (ticks, heartbeat checks, TaskControl, maintenance).
  Status restore_state();
  Status serve();
  void lead();
  // Replicas on etcd (docs/replicas.md): follow (refusing calls with the leader's
  // address) until the election is won, then restore and lead; stop when it is lost.
  Status start_replica();
  void step_down(const std::string& why) { replica_.step_down(why); }

  CpConfig cfg_;
  std::unique_ptr<EventLoop> loop_;
  CpServer server_{*loop_};  // closed first by ~Manager: its sessions reach the state
  ReplicaRole replica_;      // the election, when replicated (replica_role.h)
  Clocks clocks_;            // when the leader's rounds run (clocks.h)
  Allocator alloc_;
  Broker broker_;
  Scheduler sched_;
  ProfileRolls profile_rolls_{alloc_, broker_};  // not stored: a restart finishes at once
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<GroupCommit> group_;  // after the loop and the store: goes before them
  MachineSessions sessions_;
  MachineReports reports_;    // what the machines' daemons said last (machine.show)
  PoolChanges pool_changes_;  // machines whose profile and readiness are looked at again
  // Machines that went down wait for the failure budget, and the circuit breaker
  // (controlplane/machines/failure_budget.h).
  FailureBudget failures_{
      {cfg_.machine_failures_per_min, cfg_.machine_failures_burst, cfg_.failure_breaker}};
  // Prometheus /metrics (docs/metrics.md).
  void register_metrics();
  CpMetrics metrics_;
  // Ended tasks prune() looks at per tick.
  static constexpr size_t kPruneBudget = 20000;
  std::shared_ptr<const SecretBox> secrets_;  // secrets_key: jobs' secrets sealed at rest
  // Why machine `m` has not applied its entitlement's profile (a take_unprepared).
  std::string prepare_failure(MachineId m) const;
};

}  // namespace weft::cp
