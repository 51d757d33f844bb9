// The scheduler's core (Twine §3): jobs and their tasks, as a pure state machine. It
// turns operator requests (create, scale, update, stop) and what machines report into
// commands for machines (start this task, stop that one), using the allocator for
// placement. No I/O and no clock of its own: the daemon feeds it events with the time,
// persists its state, and sends the commands down the machines' sessions.
//
// Task lifecycle: PENDING (placed, start not yet sent) -> STARTING (sent) -> RUNNING
// (reported) -> STOPPING -> STOPPED, or FAILED (reported exit), or LOST (its machine
// died). A machine that comes back reporting a task the scheduler replaced is told to
// stop it, so a task never runs twice. Replacements and stops caused by failures are
// destructive and rate-limited (a token bucket), so a flapping rack cannot shuffle the
// fleet; what is over the limit waits for the next tick. Rolling updates replace at most
// max_unavailable tasks at a time, a new one starting only once an old one is stopped.
// A drain is make-before-break: each task on the drained machine is DRAINING (still
// running) while its replacement starts elsewhere, and is stopped once that runs.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/job_spec.h"
#include "common/result.h"
#include "common/task_report.h"
#include "common/task_state.h"
#include "controlplane/machines/failure_budget.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

using weft::kMaxTasksPerJob;
using weft::task_state_name;
using weft::TaskState;

// The scheduler's form of a job (common/job_spec.h): the operator's spec with its
// entitlement resolved to the entitlement's id.
struct JobSpec : weft::JobSpec {
  EntitlementId entitlement_id = 1;
};

struct TaskRecord {
  std::string id;  // "<job>.<index>.<generation>": unique across replacements
  std::string job;
  int index = 0;
  uint64_t generation = 0;  // the job spec generation it runs
  MachineId machine = 0;
  TaskState state = TaskState::kPending;
  uint64_t since_us = 0;
  // Why it failed when the machine said so: the agent's refusal of its start
  // ("task.resources.hugetlb: ..."), shown by job.show.
  std::string message;
  // Its spec was refused: no replacement until the job's spec changes.
  bool held = false;
  // Setup failures in a row of this index (this task's and its predecessors'), all with
  // `setup_reason`. Not stored: a restarted control plane counts again.
  int setup_failures = 0;
  std::string setup_reason;
  // Running and its readiness check passes (or it has none): its machine reports it
  // "ready". Not stored: a restarted control plane learns it from the next report.
  bool ready = false;
  // Its named ports on its machine (the job's fixed ones and those taken from the
  // machine's range): what it was started with and what service discovery publishes.
  std::map<std::string, uint16_t> ports;
  // Its job's entitlement when it was made (put_task): its output belongs there, also
  // once the job is gone and another job has its name.
  EntitlementId entitlement = 0;
  // A guest's task (an opportunistic batch job's) whose room its machine's owner took
  // back: stopping with its job's notice, then placed again elsewhere (not a failure).
  // Not stored: a restarted control plane sees a stopping task and replaces it as well.
  bool preempted = false;
};
// Placed and not ended: pending, starting or running.
inline bool task_live(TaskState s) {
  return s == TaskState::kPending || s == TaskState::kStarting || s == TaskState::kRunning;
}
// Live, or running on a drained machine until its replacement runs: what a stop or a
// scale-down must stop, and what keeps a stopping job alive.
inline bool running_copy(TaskState s) {
  return task_live(s) || s == TaskState::kDraining;
}
// Counted as available by rolling updates, drains and TaskControllers.
inline bool available(const TaskRecord& t) {
  return t.state == TaskState::kRunning && t.ready;
}

struct Command {
  // kPrefetch: ask the machine to fetch spec["fetch"] ({"image", "package"}: what the
  // update changed) now; task_id is the job's name and spec["generation"] the update's.
  enum class Kind { kStart, kStop, kPrefetch } kind;
  MachineId machine;
  std::string task_id;
  nlohmann::json spec;  // kPrefetch: what to fetch
  // kStart: the job's task.run body, serialised once per job and generation and shared
  // by its starts (weft::task_run_body), and this task's ports.
  std::shared_ptr<const std::string> body;
  std::map<std::string, uint16_t> ports;
  // kStart: the task.run parameters (`extra`: more keys, see weft::task_run_text).
  std::string run_text(std::string_view extra = {}) const {
    return weft::task_run_text(body ? *body : std::string("{}"), task_id, ports, extra);
  }
  nlohmann::json run_params() const { return nlohmann::json::parse(run_text()); }
};

// How long a rolling update waits for a machine to fetch the new image before it stops
// that machine's old task anyway (the start then waits for the fetch).
inline constexpr uint64_t kPrefetchTimeoutUs = 10ull * 60 * 1'000'000;

// TaskControl (docs/taskcontrol.md): an operation the scheduler wants to perform on a
// task of a job that names a TaskController, and performs only once the controller
// acknowledged it (or, the controller unreachable, at max_unavailable pacing).
struct Operation {
  std::string id;    // "<kind>/<task id>": the same operation keeps its id across asks
  std::string kind;  // "restart", "move", "stop"; "preempt": told, not asked (a guest's notice)
  std::string task;
  int index = 0;
  std::string reason;
};

// A job's task as its controller sees it: the newest task of each index.
struct ControlledTask {
  std::string task;
  int index = 0;
  std::string machine;  // filled in by the caller (the scheduler knows machine ids)
  MachineId machine_id = 0;
  uint64_t generation = 0;
  TaskState state = TaskState::kPending;
  std::string message;
  bool ready = false;
};

// Something that happened to a task, for its job's events (job.events): "placed",
// a state it entered ("starting", "running", "failed", "lost", "stopping", "draining",
// "stopped"), "ready" or "not ready", or an operation asked of it ("restart asked",
// "move asked") with its reason in `detail`.
struct TaskEvent {
  std::string job, task;
  MachineId machine = 0;
  std::string what, detail;
};

// One of a job's specs as it was created or updated (docs/jobs.md, "Rollouts"): its
// generation, the spec's protocol form, when and by whom.
struct Revision {
  uint64_t generation = 0;
  nlohmann::json spec;
  uint64_t at_us = 0;  // monotonic (stored as wall-clock time)
  std::string note;    // "created by CN=alice", "revert to generation 3 by ..."
  bool operator==(const Revision&) const = default;
};
inline constexpr size_t kRevisionsKept = 10;

// A job's state beyond its spec: a batch job's progress (docs/jobs.md, "Batch jobs"), a
// periodic job's last period, its rollout's pause and canary phase and its last
// revisions (docs/jobs.md, "Rollouts"): kept with the job, across restarts, failovers
// and moves between shards.
struct JobProgress {
  int succeeded = 0;                // batch: tasks that exited 0
  int failed = 0;                   // batch: failures counted against batch.max_failures
  std::string outcome;              // batch: "" while it runs, "succeeded" or "failed"
  std::string reason;               // why it ended; while it runs, its last failure
  uint64_t started_us = 0;          // batch: made (its deadline counts from here)
  uint64_t ended_us = 0;            // batch: when outcome was set
  int64_t last_period = 0;          // periodic: the newest period (unix seconds) run or skipped
  std::string parent;               // a periodic job's run: that job
  bool paused = false;              // its rollouts hold (weftctl job rollout pause)
  bool canary = false;              // its update's canaries wait for a promotion
  std::vector<Revision> revisions;  // the latest kRevisionsKept, oldest first
  bool operator==(const JobProgress&) const = default;
};
// Its stored and carried form: `time_of` turns the monotonic times into the form's own
// (wall-clock µs in a store, ages in a move document), `mono_of` back. A hostile or
// malformed member reads as its default.
nlohmann::json progress_json(const JobProgress& p, const std::function<int64_t(uint64_t)>& time_of);
JobProgress progress_from_json(const nlohmann::json& j,
                               const std::function<uint64_t(int64_t)>& mono_of);

// An index whose tasks failed this many times in a row before their program ran, with
// one reason, is held (see Scheduler::report_list).
inline constexpr int kSetupFailuresHeld = 3;

struct SchedulerLimits {
  double destructive_per_min = 60;  // replacements + stops caused by failures
  double destructive_burst = 20;
};

class Scheduler {
 public:
  Scheduler(Allocator& alloc, SchedulerLimits limits = {}) : alloc_(alloc), limits_(limits) {}

  Result<std::vector<Command>> create(const JobSpec& spec, uint64_t now_us);
  // A new task count. `through_controller`: a job with a TaskController (not in its
  // fallback) is shrunk as its controller consents: each task above the new count is a
  // pending `stop` operation until acknowledged (autoscaling's scale-downs; an
  // operator's job.scale is the operator's own decision and goes at once).
  Result<std::vector<Command>> scale(const std::string& job, int count, uint64_t now_us,
                                     bool through_controller = false);
  // The count the job is going to: a controlled shrink's while it waits, else its count.
  int target_count(const std::string& job) const;
  // A new spec for a running job: tasks are replaced max_unavailable at a time. A job
  // that autoscales (before or after) keeps the size autoscaling gave it.
  Result<std::vector<Command>> update(const JobSpec& spec, uint64_t now_us);
  // The job's autoscaling settings (paused or resumed, say), kept with the job; nothing
  // of its tasks changes.
  Status set_autoscale(const std::string& job, const std::optional<AutoscaleSpec>& a);
  // Machine `m` answered the prefetch of `job`'s update `generation` (fetched, or
  // failed: either way its old tasks may roll now).
  std::vector<Command> prefetched(const std::string& job, uint64_t generation, MachineId m,
                                  uint64_t now_us);
  Result<std::vector<Command>> stop(const std::string& job, uint64_t now_us);
  // TaskControl. Jobs that name a TaskController, in name order.
  std::vector<std::string> controlled_jobs() const;
  // Jobs with autoscale settings (paused or not), not stopping, in name order.
  std::vector<std::string> autoscaled_jobs() const;
  // What the scheduler wants to do to the job's tasks and waits to be acknowledged for,
  // in task index order.
  std::vector<Operation> pending_operations(const std::string& job) const;
  // The newest task of each index of the job.
  std::vector<ControlledTask> controlled_tasks(const std::string& job) const;
  // Operations performed since the last call whose task index runs again (a restart is
  // complete when the index's new task runs).
  std::vector<std::string> take_completed(const std::string& job);
  // The controller acknowledged these operations: performed now (unknown or no longer
  // pending ids are ignored). The commands to send.
  std::vector<Command> grant(const std::string& job, const std::vector<std::string>& op_ids,
                             uint64_t now_us);
  // The controller is unreachable past its timeout and the job says "proceed" (true):
  // the job moves at max_unavailable pacing until it answers again (false).
  std::vector<Command> set_control_fallback(const std::string& job, bool on, uint64_t now_us);
  bool control_fallback(const std::string& job) const;

  // Undoes a create() whose write failed, before any of its commands was sent: the job,
  // its tasks and its placement go, and machines it took return to the free pool.
  void abandon(const std::string& job);

  // Jobs whose tasks changed state through report() since the last call: a report that
  // changed nothing (the common case, every heartbeat) needs no write.
  std::set<std::string> take_reported_changes() { return std::exchange(reported_changes_, {}); }
  // Jobs whose own record (spec, generation, stopping, existence) changed since the last
  // call: with the allocator's changed placements, the job rows the daemon writes.
  std::set<std::string> take_changed_jobs() { return std::exchange(changed_jobs_, {}); }
  // Tasks created or changed since the last call: what the daemon writes (it need not
  // rewrite a job's other tasks).
  std::unordered_set<std::string> take_dirty_tasks() { return std::exchange(dirty_, {}); }

  // A machine's full report: the task ids it runs and their states ("running",
  // "exited", "failed", ...). Unknown or stale tasks are stopped; tasks missing from a
  // report after they started are LOST and replaced.
  // `forget` (optional) receives the reported tasks that ended and whose end this
  // scheduler has recorded (or never knew): the machine may drop them from its reports.
  // `tasks` in id order (weft::parse_task_report's form).
  // `failures`: the machine's reasons for tasks it reports failed (the task's MESSAGE).
  // A task that failed before its program ran (`setup`) with the reason its index's
  // last kSetupFailuresHeld tasks failed with would fail the same way again: it is held,
  // as a refused spec is, until the job's spec changes.
  // `running_is_ready`: the machine's "running" means ready (a daemon that does not
  // report readiness), read so without a copy of its list.
  std::vector<Command> report_list(MachineId m, const weft::TaskList& tasks, uint64_t now_us,
                                   std::vector<std::string>* forget = nullptr,
                                   const weft::TaskFailures* failures = nullptr,
                                   bool running_is_ready = false);
  // A machine's changes since its last report (weft::apply_task_changes's result): the
  // tasks named are handled as in report_list; tasks not named are as they were, and a
  // task that should run here but is missing is found by the next full report.
  std::vector<Command> report_changes(MachineId m, const weft::TaskChanges& changes,
                                      uint64_t now_us, std::vector<std::string>* forget = nullptr,
                                      const weft::TaskFailures* failures = nullptr);
  // The same from a map.
  std::vector<Command> report(MachineId m, const std::map<std::string, TaskState>& tasks,
                              uint64_t now_us, std::vector<std::string>* forget = nullptr);
  // The machine refused to start the task (its spec, or something this machine lacks):
  // the task is FAILED with the machine's message, at once rather than after the start
  // grace. A refusal of the spec itself (`bad_spec`) is not retried: the same spec
  // would be refused again anywhere; the job's next update replaces it. Any other
  // refusal is replaced like a failure (rate-limited).
  std::vector<Command> start_refused(const std::string& task_id, const std::string& message,
                                     bool bad_spec, uint64_t now_us);
  // The broker declared a machine dead or failed: its tasks are LOST and replaced.
  // `prepaid`: the daemon's machine-failure budget paid for this machine; its tasks do
  // not take tokens from the per-task bucket.
  std::vector<Command> machine_down(MachineId m, uint64_t now_us, bool prepaid = false);
  // An operator drained the machine: its tasks are replaced elsewhere first and stopped
  // once their replacements run (tasks never started are simply moved).
  std::vector<Command> machine_drain(MachineId m, uint64_t now_us);
  // The machine did not apply its entitlement's profile in time (Broker::take_unprepared;
  // mark it unusable first): the tasks waiting on it are LOST with `why` as MESSAGE and
  // placed elsewhere.
  std::vector<Command> machine_unprepared(MachineId m, const std::string& why, uint64_t now_us);
  // The machine is back in service: moves its drain wanted and a controller has not
  // acknowledged yet are not wanted any more.
  void machine_undrained(MachineId m);
  // A drained machine's deadline (planned maintenance starts): what still runs there is
  // stopped now; a move a controller has not acknowledged is performed without it (the
  // index is replaced elsewhere), and a draining copy stops whether or not its
  // replacement is ready.
  std::vector<Command> machine_evict(MachineId m, uint64_t now_us);
  // The ReBalancer moves a ready task to machine `to` (rebalancer.h), make before break:
  // a copy of its index starts there and the task stops once the copy is ready. A job
  // with a TaskController (not in its fallback) is asked first: a pending `move`
  // operation with `reason`, carried out when acknowledged (dropped if `to` cannot take
  // it by then). Every move takes a token of the destructive-operation budget. Refused
  // (nothing changes) when the task is not ready, its job is stopping, updating, fenced,
  // has a task not available or a move under way, or `to` cannot take the task.
  Result<std::vector<Command>> move_task(const std::string& task_id, MachineId to,
                                         const std::string& reason, uint64_t now_us);
  // An operator restarts one task (task.restart): it stops, and its index starts again
  // on its machine. A job with a TaskController (not in its fallback) is asked first: a
  // pending `restart` operation with `reason`, carried out when acknowledged (at most
  // max_unavailable of the job's indices down for weft's operations at once), as an
  // update's restarts are. Returns the commands to send now (none while it waits), and
  // whether it waits.
  Result<std::vector<Command>> restart_task(const std::string& task_id, const std::string& reason,
                                            uint64_t now_us, bool* waits);
  // A task's machine says it failed its liveness check again and again (`why`): it is
  // restarted as an operator's restart_task is (its TaskController asked first), paid
  // for from the destructive-operation budget. Nothing happens (ok, no commands) when a
  // restart is already asked of its controller; refused when it is not running or the
  // budget is spent (its machine says it again after more failures).
  Result<std::vector<Command>> liveness_failed(const std::string& task_id, const std::string& why,
                                               uint64_t now_us, bool* waits);
  // A move asked of a job's controller that it has not acknowledged: withdrawn (the
  // ReBalancer's moves that waited too long). False if there was none.
  bool withdraw_move(const std::string& task_id);
  // Whether the task's move (move_task) is still under way: asked and not acknowledged,
  // or the task still runs beside its copy.
  bool moving(const std::string& task_id) const;
  // Continues what waited: rate-limited replacements, rolling updates, batch jobs'
  // deadlines.
  std::vector<Command> tick(uint64_t now_us);
  // Batch and periodic jobs (scheduler_batch.cc). A job's progress (nullopt: no job).
  std::optional<JobProgress> progress(const std::string& job) const;
  // Periodic jobs (not stopping) and their runs that have not ended, by name.
  std::map<std::string, std::vector<std::string>> periodic_jobs() const;
  // Runs of a periodic job that ended, oldest first (for its history limits).
  std::vector<std::string> ended_runs(const std::string& job) const;
  // Starts the run of periodic `job` for `period` (unix seconds): a batch job named
  // weft::period_run_name(job, period), recorded with the period as the job's last in
  // the same write, so that no period runs twice. Fails (nothing changes) when the run
  // cannot be placed; the caller tries again.
  Result<std::vector<Command>> start_period(const std::string& job, int64_t period,
                                            uint64_t now_us);
  // The period passes without a run (overlap "forbid", or the first look at a new job).
  void skip_period(const std::string& job, int64_t period, const std::string& why);
  // Rollouts (scheduler_rollout.cc). Paused: no task is restarted for an update (an
  // operator's restart of one task still goes); resumed: it rolls on.
  Result<std::vector<Command>> pause_rollout(const std::string& job, bool paused, uint64_t now_us);
  // The canaries are good: the update rolls on to every task. A job without a canary
  // phase: refused.
  Result<std::vector<Command>> promote(const std::string& job, uint64_t now_us,
                                       const std::string& why);
  // Says who made the job's latest revision and how ("updated by CN=alice").
  void note_revision(const std::string& job, const std::string& note);
  // Forgets ended tasks (stopped, failed, lost) that nothing waits on any more: those of
  // jobs that are gone at once, others once they ended `retain_us` ago and a newer task
  // has their index (or the index no longer exists). Returns their ids, for the store.
  // Keeps the task table bounded by the jobs' sizes. Looks at about `budget` tasks, job
  // by job, carrying on where the last call stopped: the daemon's tick stays short at
  // any fleet size, and every job is visited in turn.
  std::vector<std::string> prune(uint64_t now_us, uint64_t retain_us, size_t budget = SIZE_MAX);
  // Tasks placed on a machine that is not ready (it just joined the entitlement and its
  // host profile is not applied yet) stay PENDING; the broker's word that it is ready
  // starts them.
  void set_ready_check(std::function<bool(MachineId)> ready) { ready_ = std::move(ready); }
  // The data centre an entitlement is pinned to ("" = any): a hard constraint on every
  // placement of its jobs.
  void set_entitlement_dc(std::function<std::string(EntitlementId)> dc) { dc_of_ = std::move(dc); }
  std::vector<Command> machine_ready(MachineId m, uint64_t now_us);

  // What happened to tasks since the last call, in order (at most kEventsKept: the
  // oldest go first when nobody takes them). A state event's detail is the task's
  // message when it has one (why it failed).
  std::vector<TaskEvent> take_events();
  static constexpr size_t kEventsKept = 100000;

  // Jobs whose published endpoints may have changed since the last call: a task became
  // ready or not, started, stopped, ended, or moved (controlplane/discovery/service_table.h).
  std::set<std::string> take_service_changes() { return std::exchange(service_changes_, {}); }

  // Unordered (a report looks up each of its tasks: hashing, not a tree walk of string
  // compares); tasks_of and tasks_on are in (index, id) and id order.
  const std::unordered_map<std::string, TaskRecord>& tasks() const { return tasks_; }
  // How many tasks are in state s, and how many jobs there are (for metrics: no walk).
  // Where a task that is no longer kept ran (the last kErasedKept), and the entitlement
  // its job was in then: its output may still be on that machine (task.logs), and it
  // belongs to that entitlement, whatever job carries the name now (0: its job was
  // already gone, so no entitlement's owners may read it).
  struct Erased {
    MachineId machine = 0;
    EntitlementId entitlement = 0;
  };
  std::optional<Erased> erased_on(const std::string& id) const {
    auto it = erased_.find(id);
    if (it == erased_.end()) return std::nullopt;
    return it->second;
  }
  static constexpr size_t kErasedKept = 4096;
  size_t count_in(TaskState s) const { return by_state_[static_cast<size_t>(s)]; }
  size_t job_count() const { return jobs_.size(); }
  // What the store keeps, and puts back after a restart (the allocator's placement is
  // restored separately, before).
  struct PersistedJob {
    JobSpec spec;
    uint64_t generation = 1;
    bool stopping = false;
    JobProgress progress;
  };
  std::vector<PersistedJob> persisted_jobs() const;
  void restore_job(const PersistedJob& j);
  void restore_task(const TaskRecord& t);
  // After the jobs and tasks are back: lost, failed and draining tasks whose index has no
  // running copy wait for their replacement again.
  void finish_restore();
  // An entitlement moving between a region's shards (docs/regions.md, "Moving an
  // entitlement"): while it is fenced the scheduler does nothing for it. Its jobs refuse
  // create, scale, update and stop; what its machines report is not taken in (its tasks
  // stay as they were); its machines' failures, drains and readiness are not acted on;
  // its replacements and rolling updates wait; TaskControl leaves its jobs alone. The
  // shard it moves to carries on from exactly that state; should the move roll back,
  // this one does (the next full report says what changed meanwhile).
  void fence(EntitlementId e, bool on) {
    if (on)
      fenced_.insert(e);
    else
      fenced_.erase(e);
  }
  bool fenced(EntitlementId e) const { return fenced_.count(e) > 0; }
  // A job as another shard needs it to carry on where this one stopped: what the store
  // keeps and TaskControl's acknowledgements and moves under way (moved_job); taken in
  // with its tasks, their machines this scheduler's ids (adopt_job: its lost and failed
  // indices wait for replacements as after a restart). forget_job drops a job and its
  // tasks without a command: they run on, another shard's now.
  struct MovedJob {
    PersistedJob job;
    std::set<std::string> granted, moves;
    std::map<int, std::string> in_progress;
    bool fallback = false;
  };
  std::optional<MovedJob> moved_job(const std::string& name) const;
  void adopt_job(const MovedJob& j, const std::vector<TaskRecord>& tasks);
  void forget_job(const std::string& name);
  uint64_t task_seq() const { return seq_; }
  void set_task_seq(uint64_t s) { seq_ = s; }
  std::vector<TaskRecord> tasks_of(const std::string& job) const;
  // The same without copies (valid until the scheduler changes).
  std::vector<const TaskRecord*> task_refs_of(const std::string& job) const;
  std::vector<TaskRecord> tasks_on(MachineId m) const;
  std::optional<PersistedJob> persisted_job(const std::string& name) const;
  std::optional<JobSpec> job(const std::string& name) const;
  uint64_t generation(const std::string& job) const;
  size_t waiting_for_budget() const { return waiting_.size(); }

 private:
  struct Job {
    JobSpec spec;
    uint64_t generation = 1;
    bool stopping = false;
    JobProgress progress;
    // A batch job that ended (succeeded or failed): nothing of it runs again.
    bool ended() const { return !progress.outcome.empty(); }
    // Since when all its canaries are ready (auto_promote); 0: not all. Not stored.
    uint64_t canaries_ready_since_us = 0;
    // An update may have live tasks of an older generation left to roll (cleared by
    // roll() once none is left): a task that starts running only matters to roll().
    bool rolling = false;
    // TaskControl: operations acknowledged and not performed yet; performed ones by
    // index until that index runs again; the controller unreachable (fallback pacing).
    std::set<std::string> granted;
    std::set<std::string> moves;  // tasks a drain wants moved, waiting for an ack
    // Tasks the ReBalancer wants moved to a machine, waiting for an ack (not stored, not
    // carried to another shard: the ReBalancer plans again there).
    struct Retarget {
      MachineId to = 0;
      std::string reason;
    };
    std::map<std::string, Retarget> retargets;
    // Tasks an operator restarts (restart_task), waiting for the controller: task ->
    // reason. Not stored (a restarted control plane forgets the request).
    std::map<std::string, std::string> restarts;
    std::map<int, std::string> in_progress;
    std::vector<std::string> completed;
    bool fallback = false;
    bool controlled() const { return spec.controller.has_value() && !fallback; }
    // A shrink waiting for the controller (scale's through_controller): the indices from
    // here up stop as it consents, are not replaced meanwhile, and the count becomes this
    // once none of them runs; 0 = none. Not stored: after a restart the job keeps its
    // count (and autoscaling decides again).
    int shrink_to = 0;
    int wanted() const { return shrink_to ? shrink_to : spec.count; }
    // A rolling update to a new image: the machines still fetching it (their old tasks
    // wait) until the deadline. Not stored: after a restart the update just rolls.
    std::set<MachineId> prefetching;
    uint64_t prefetch_deadline_us = 0;
    // task.run's body for this generation (start_cmd), made at the first start.
    mutable std::shared_ptr<const std::string> run_body;
    mutable uint64_t run_body_generation = 0;
  };
  // One reported task (report_list, report_changes), and what the report led to.
  struct Observed {
    const weft::TaskFailures* failures = nullptr;
    std::vector<Command> out;
    std::vector<std::string> replace_ids;
    std::set<std::string> rolled;   // a task stopped: the job may converge and roll
    std::set<std::string> started;  // a task started: an update may roll on
  };
  void observe(MachineId m, const std::string& id, TaskState state, uint64_t now_us, Observed* o,
               std::vector<std::string>* forget);
  std::vector<Command> finish_report(Observed& o, uint64_t now_us);
  // A controlled job's task moved off its drained machine (make before break); false
  // when it is not live any more.
  bool move_now(Job& j, const std::string& task_id, uint64_t now_us, std::vector<Command>* out);
  // The ReBalancer's move of a live task to `to`, now: the allocator's slot moves, the
  // task drains and its copy starts there.
  Status move_to(Job& j, TaskRecord& t, MachineId to, uint64_t now_us, std::vector<Command>* out);
  // A new task for old's index on `machine` (the allocator placed it there).
  void launch_copy(Job& j, const TaskRecord& old, MachineId machine, uint64_t now_us,
                   std::vector<Command>* out);
  // A controlled shrink whose tasks above it all stopped (or whose controller fell back):
  // the count becomes shrink_to.
  void finish_shrink(Job& j, uint64_t now_us, std::vector<Command>* out);
  // The task tables, with their indexes by job (and index) and by machine.
  void put_task(const TaskRecord& t);
  void set_state(TaskRecord& t, TaskState s) {
    --by_state_[static_cast<size_t>(t.state)];
    ++by_state_[static_cast<size_t>(s)];
    t.state = s;
    dirty_.insert(t.id);
    service_changes_.insert(t.job);
    event(t, task_state_name(s));
  }
  // Batch jobs (scheduler_batch.cc). A task of batch job `j` ended: it exited 0 (a
  // completion) or failed (counted against max_failures).
  void batch_task_ended(Job& j, const TaskRecord& t, bool succeeded);
  // The job completed, failed past its budget or has a task that cannot start: it ends.
  void check_batch(Job& j, uint64_t now_us, std::vector<Command>* out);
  void end_batch(Job& j, const char* outcome, const std::string& reason, uint64_t now_us,
                 std::vector<Command>* out);
  // Batch jobs whose free slots need a look (restored, adopted): converged at the tick.
  std::set<std::string> batch_idle_;
  // An event of the job itself (task ""): a batch job's end, a period's run or skip.
  // The job's spec as a new revision (create, update): the oldest beyond
  // kRevisionsKept goes. An update with canaries starts its canary phase.
  void add_revision(Job& j, uint64_t now_us);
  // How many more tasks an update may restart now: none while paused, the canaries
  // left to start in a canary phase, else any number (the pacing is max_unavailable's).
  int update_restarts_allowed(const Job& j) const;
  // Canary phases whose canaries have been ready for auto_promote: promoted.
  void auto_promote(uint64_t now_us, std::vector<Command>* out);
  void job_event(const std::string& job, std::string what, std::string detail) {
    if (events_.size() >= kEventsKept) events_.pop_front();
    events_.push_back(TaskEvent{job, "", 0, std::move(what), std::move(detail)});
  }
  void event(const TaskRecord& t, std::string what, std::string detail = "") {
    if (events_.size() >= kEventsKept) events_.pop_front();
    events_.push_back(TaskEvent{t.job, t.id, t.machine, std::move(what), std::move(detail)});
  }
  std::deque<TaskEvent> events_;
  std::unordered_map<std::string, Erased> erased_;
  std::deque<std::string> erased_order_;
  void erase_task(const std::string& id);
  template <class F>
  void for_job(const std::string& job, F&& f) {
    if (auto j = job_tasks_.find(job); j != job_tasks_.end())
      for (const auto& entry : j->second) f(*entry.second);
  }
  template <class F>
  void for_machine(MachineId m, F&& f) {
    if (auto it = machine_tasks_.find(m); it != machine_tasks_.end())
      for (const auto& entry : it->second) f(*entry.second);
  }
  void wait(const std::string& task_id);  // queues a replacement for the budget
  template <class Pred>
  void unwait_if(Pred pred) {
    auto keep = std::remove_if(waiting_.begin(), waiting_.end(), [&](const std::string& id) {
      if (!pred(id)) return false;
      waiting_set_.erase(id);
      return true;
    });
    waiting_.erase(keep, waiting_.end());
  }
  static Error moving_error();  // a call on a job of a fenced entitlement
  // The task's start was refused under the job's current spec (see start_refused).
  static bool refused(const TaskRecord& t, const Job& j);
  Command start_cmd(const Job& j, const TaskRecord& t) const;
  // Places the job's current layout with the allocator and creates tasks for indices
  // that have none live.
  Result<std::vector<Command>> converge(Job& j, uint64_t now_us);
  // Guests' tasks whose room placements took back (Allocator::take_evictions): each is
  // told to stop within its job's notice, and placed again once it ended.
  void preempt_guests(uint64_t now_us, std::vector<Command>* out);
  void replace(const std::string& task_id, uint64_t now_us, std::vector<Command>* out,
               bool prepaid = false);
  std::vector<Command> roll(Job& j, uint64_t now_us);
  // A task of the job stopped or started running: continue a rolling update or scale
  // down, or finish stopping the job.
  std::vector<Command> after_stopped(const std::string& job, uint64_t now_us);
  // The task just reported running: a DRAINING copy of its index is stopped now.
  void stop_drained_sibling(const TaskRecord& t, uint64_t now_us, std::vector<Command>* out);

  // Records a new task; sends its start now if its machine is ready.
  void launch(const Job& j, TaskRecord t, std::vector<Command>* out);

  Allocator& alloc_;
  SchedulerLimits limits_;
  std::function<bool(MachineId)> ready_;
  std::function<std::string(EntitlementId)> dc_of_;
  TokenBucket tokens_{limits_.destructive_per_min, limits_.destructive_burst};
  std::map<std::string, Job> jobs_;
  std::unordered_map<std::string, TaskRecord> tasks_;  // live and recently ended (see prune)
  // Indexes into tasks_ (its nodes do not move): by job and (index, id), by machine and id.
  std::map<std::string, std::map<std::pair<int, std::string>, TaskRecord*>> job_tasks_;
  std::unordered_map<MachineId, std::map<std::string, TaskRecord*>> machine_tasks_;
  std::array<size_t, weft::kTaskStateCount> by_state_{};
  std::string prune_cursor_;          // the job prune() looks at next
  std::vector<std::string> waiting_;  // LOST/FAILED tasks whose replacement waits
  std::unordered_set<std::string> waiting_set_;
  std::unordered_set<std::string> dirty_;
  std::set<std::string> reported_changes_;  // jobs whose tasks a report changed
  std::set<std::string> changed_jobs_;
  std::set<std::string> service_changes_;
  std::unordered_set<MachineId> drained_;     // machine_drain'ed and not undrained
  std::unordered_set<EntitlementId> fenced_;  // fence()
  bool job_fenced(const std::string& job) const {
    if (fenced_.empty()) return false;
    auto it = jobs_.find(job);
    return it != jobs_.end() && fenced_.count(it->second.spec.entitlement_id);
  }
  bool machine_fenced(MachineId m) const {
    return !fenced_.empty() && m < alloc_.machine_count() &&
           fenced_.count(alloc_.entitlement_of(m));
  }
  // Lost, failed and draining tasks whose index has no running copy wait for their
  // replacement (of one job, or of every job when `only` is null).
  void queue_waits(const std::string* only);
  uint64_t seq_ = 0;  // task id sequence
};

}  // namespace weft::cp
