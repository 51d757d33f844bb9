// The scheduler's TaskControl (scheduler.h, docs/taskcontrol.md): what it wants to do to
// a controlled job's tasks (an update's restarts, a drain's and the ReBalancer's moves, an
// operator's or liveness's restart, a shrink's stops) as operations its controller
// acknowledges, performed when acknowledged or, the controller away, at fallback pacing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

class Operations {
 public:
  explicit Operations(Scheduler& s) : s_(s) {}
  // Jobs that name a TaskController, in name order.
  std::vector<std::string> controlled_jobs() const;
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

 private:
  friend class Scheduler;
  // A controlled shrink whose tasks above it all stopped (or whose controller fell back):
  // the count becomes shrink_to.
  void finish_shrink(JobRecord& j, uint64_t now_us, std::vector<Command>* out);

  Scheduler& s_;
};

}  // namespace weft::cp
