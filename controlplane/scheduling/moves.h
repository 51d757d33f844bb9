// The scheduler's moves (scheduler.h): drains, make before break (a drained machine's
// tasks start elsewhere and stop once their copies run; break before make for a job of
// at most one copy, whose task stops first), the eviction at a drain's deadline, and the
// ReBalancer's moves of a ready task to a chosen machine.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

class Moves {
 public:
  explicit Moves(Scheduler& s) : s_(s) {}
  // An operator drained the machine: its tasks are replaced elsewhere first and stopped
  // once their replacements run (tasks never started are simply moved).
  std::vector<Command> machine_drain(MachineId m, uint64_t now_us);
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
  // A move asked of a job's controller that it has not acknowledged: withdrawn (the
  // ReBalancer's moves that waited too long). False if there was none.
  bool withdraw_move(const std::string& task_id);
  // Whether the task's move (move_task) is still under way: asked and not acknowledged,
  // or the task still runs beside its copy.
  bool moving(const std::string& task_id) const;

 private:
  friend class Scheduler;
  friend class Operations;
  friend class Placer;
  // A controlled job's task moved off its drained machine (make before break); false
  // when it is not live any more.
  bool move_now(JobRecord& j, const std::string& task_id, uint64_t now_us,
                std::vector<Command>* out);
  // The ReBalancer's move of a live task to `to`, now: the allocator's slot moves, the
  // task drains and its copy starts there.
  Status move_to(JobRecord& j, TaskRecord& t, MachineId to, uint64_t now_us,
                 std::vector<Command>* out);
  // A task of an at-most-one job moves break before make: it is stopped now, and its
  // index starts again (Placer::converge, once the stop is confirmed) where its slot is.
  void stop_first(TaskRecord& t, uint64_t now_us, std::vector<Command>* out);
  // The task just reported running: a DRAINING copy of its index is stopped now.
  void stop_drained_sibling(const TaskRecord& t, uint64_t now_us, std::vector<Command>* out);

  Scheduler& s_;
  std::unordered_set<MachineId> drained_;  // machine_drain'ed and not undrained
};

}  // namespace weft::cp
