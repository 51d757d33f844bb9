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
//
// The scheduler is its parts, each in its own file with its own state: placement
// (placement.h), replacements and their budget (replacement.h), rollouts and canaries
// (rollout.h), batch and periodic jobs (batch.h), drains and moves (moves.h), TaskControl's
// operations (operations.h) and what is kept and handed over (handover.h), over one task
// table (task_table.h). This class holds the jobs and answers what concerns a job's
// whole life: create, scale, stop, and what machines report.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/task_report.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/batch.h"
#include "controlplane/scheduling/handover.h"
#include "controlplane/scheduling/job_record.h"
#include "controlplane/scheduling/moves.h"
#include "controlplane/scheduling/operations.h"
#include "controlplane/scheduling/placer.h"
#include "controlplane/scheduling/records.h"
#include "controlplane/scheduling/replacement.h"
#include "controlplane/scheduling/rollout.h"
#include "controlplane/scheduling/task_table.h"

namespace weft::cp {

class Scheduler {
 public:
  explicit Scheduler(Allocator& alloc, SchedulerLimits limits = {})
      : alloc_(alloc), replacement_(*this, limits) {}
  Scheduler(const Scheduler&) = delete;  // its parts hold it
  Scheduler& operator=(const Scheduler&) = delete;
  using PersistedJob = cp::PersistedJob;
  using MovedJob = cp::MovedJob;

  // Its parts.
  Placer& placer() { return placer_; }
  Replacement& replacement() { return replacement_; }
  Rollouts& rollouts() { return rollouts_; }
  BatchRuns& batch() { return batch_; }
  const BatchRuns& batch() const { return batch_; }
  Moves& moves() { return moves_; }
  const Moves& moves() const { return moves_; }
  Operations& operations() { return operations_; }
  const Operations& operations() const { return operations_; }
  Handover& handover() { return handover_; }
  const Handover& handover() const { return handover_; }

  Result<std::vector<Command>> create(const JobSpec& spec, uint64_t now_us);
  // A new task count. `through_controller`: a job with a TaskController (not in its
  // fallback) is shrunk as its controller consents: each task above the new count is a
  // pending `stop` operation until acknowledged (autoscaling's scale-downs; an
  // operator's job.scale is the operator's own decision and goes at once).
  Result<std::vector<Command>> scale(const std::string& job, int count, uint64_t now_us,
                                     bool through_controller = false);
  // The count the job is going to: a controlled shrink's while it waits, else its count.
  int target_count(const std::string& job) const;
  // The job's autoscaling settings (paused or resumed, say), kept with the job; nothing
  // of its tasks changes.
  Status set_autoscale(const std::string& job, const std::optional<AutoscaleSpec>& a);
  Result<std::vector<Command>> stop(const std::string& job, uint64_t now_us);
  // Jobs with autoscale settings (paused or not), not stopping, in name order.
  std::vector<std::string> autoscaled_jobs() const;
  // Undoes a create() whose write failed, before any of its commands was sent: the job,
  // its tasks and its placement go, and machines it took return to the free pool.
  void abandon(const std::string& job);
  // Jobs whose tasks changed state through report() since the last call: a report that
  // changed nothing (the common case, every heartbeat) needs no write.
  std::set<std::string> take_reported_changes() { return std::exchange(reported_changes_, {}); }
  // Jobs whose own record (spec, generation, stopping, existence) changed since the last
  // call: with the allocator's changed placements, the job rows the daemon writes.
  std::set<std::string> take_changed_jobs() { return std::exchange(changed_jobs_, {}); }
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
  // Continues what waited: rate-limited replacements, rolling updates, batch jobs'
  // deadlines.
  std::vector<Command> tick(uint64_t now_us);
  // Forgets ended tasks (stopped, failed, lost) that nothing waits on any more: those of
  // jobs that are gone at once, others once they ended `retain_us` ago and a newer task
  // has their index (or the index no longer exists). Returns their ids, for the store.
  // Keeps the task table bounded by the jobs' sizes. Looks at about `budget` tasks, job
  // by job, carrying on where the last call stopped: the daemon's tick stays short at
  // any fleet size, and every job is visited in turn.
  std::vector<std::string> prune(uint64_t now_us, uint64_t retain_us, size_t budget = SIZE_MAX);

  // The tasks (task_table.h), and what changed in them since the last take.
  const TaskTable& tasks() const { return table_; }
  std::unordered_set<std::string> take_dirty_tasks() { return table_.take_dirty(); }
  std::vector<TaskEvent> take_events() { return table_.take_events(); }
  std::set<std::string> take_service_changes() { return table_.take_service_changes(); }
  size_t job_count() const { return jobs_.size(); }
  uint64_t task_seq() const { return seq_; }
  void set_task_seq(uint64_t s) { seq_ = s; }
  std::optional<JobSpec> job(const std::string& name) const;
  uint64_t generation(const std::string& job) const;

 private:
  friend class Placer;
  friend class Replacement;
  friend class Rollouts;
  friend class BatchRuns;
  friend class Moves;
  friend class Operations;
  friend class Handover;
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
  // A task of the job stopped or started running: continue a rolling update or scale
  // down, or finish stopping the job.
  std::vector<Command> after_stopped(const std::string& job, uint64_t now_us);

  Allocator& alloc_;
  std::map<std::string, JobRecord> jobs_;
  TaskTable table_;                         // live and recently ended tasks (see prune)
  std::set<std::string> reported_changes_;  // jobs whose tasks a report changed
  std::set<std::string> changed_jobs_;
  std::string prune_cursor_;  // the job prune() looks at next
  uint64_t seq_ = 0;          // task id sequence
  Placer placer_{*this};
  Replacement replacement_;
  Rollouts rollouts_{*this};
  BatchRuns batch_{*this};
  Moves moves_{*this};
  Operations operations_{*this};
  Handover handover_{*this};
};

}  // namespace weft::cp
