// The scheduler's placement (scheduler.h): a job's layout placed with the allocator and
// a task made for each index that has none live, started at once on a machine that is
// ready and held PENDING on one whose host profile is not applied yet; guests whose room
// a placement took back told to leave.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

class Placer {
 public:
  explicit Placer(Scheduler& s) : s_(s) {}
  // Tasks placed on a machine that is not ready (it just joined the entitlement and its
  // host profile is not applied yet) stay PENDING; the broker's word that it is ready
  // starts them.
  void set_ready_check(std::function<bool(MachineId)> ready) { ready_ = std::move(ready); }
  // The data centre an entitlement is pinned to ("" = any): a hard constraint on every
  // placement of its jobs.
  void set_entitlement_dc(std::function<std::string(EntitlementId)> dc) { dc_of_ = std::move(dc); }
  std::vector<Command> machine_ready(MachineId m, uint64_t now_us);
  // The machine did not apply its entitlement's profile in time (Broker::take_unprepared;
  // mark it unusable first): the tasks waiting on it are LOST with `why` as MESSAGE and
  // placed elsewhere.
  std::vector<Command> machine_unprepared(MachineId m, const std::string& why, uint64_t now_us);

 private:
  friend class Scheduler;
  friend class Replacement;
  friend class Moves;
  friend class BatchRuns;
  friend class Rollouts;
  // task.run for the task, its body made once per job and generation.
  Command start_cmd(const JobRecord& j, const TaskRecord& t) const;
  // Places the job's current layout with the allocator and creates tasks for indices
  // that have none live.
  Result<std::vector<Command>> converge(JobRecord& j, uint64_t now_us);
  // Guests' tasks whose room placements took back (Allocator::take_evictions): each is
  // told to stop within its job's notice, and placed again once it ended.
  void preempt_guests(uint64_t now_us, std::vector<Command>* out);
  // Records a new task; sends its start now if its machine is ready.
  void launch(const JobRecord& j, TaskRecord t, std::vector<Command>* out);
  // A new task for old's index on `machine` (the allocator placed it there).
  void launch_copy(JobRecord& j, const TaskRecord& old, MachineId machine, uint64_t now_us,
                   std::vector<Command>* out);

  Scheduler& s_;
  std::function<bool(MachineId)> ready_;
  std::function<std::string(EntitlementId)> dc_of_;
};

}  // namespace weft::cp
