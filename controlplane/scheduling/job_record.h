// The scheduler's record of a job (scheduler.h): its spec and generation, and what each
// of the scheduler's parts keeps of it (a batch job's progress, a rolling update's
// prefetches, TaskControl's acknowledgements and moves, a controlled shrink). Shared by
// the parts, never seen outside the scheduler.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/records.h"

namespace weft::cp {

struct JobRecord {
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

// The tasks a machine's loss (or its report) declared lost, for one log line: the first
// 20 by id and state, and how many in all (a machine may run hundreds).
struct LostNote {
  std::string named;
  size_t count = 0;
  void add(const TaskRecord& t) {
    if (++count <= 20)
      named += (named.empty() ? "" : ", ") + t.id + " (" + task_state_name(t.state) + ")";
  }
};

// Its task's start was refused under the job's current spec (the same spec would be
// refused again: the index waits for an update).
inline bool refused(const TaskRecord& t, const JobRecord& j) {
  return t.state == TaskState::kFailed && t.held && t.generation == j.generation;
}
// The error of a call on a job of a fenced entitlement (one moving between shards).
Error moving_error();

}  // namespace weft::cp
