// The scheduler's handover (scheduler.h): what the store keeps of its jobs and puts back
// after a restart or a failover, a job carried to another shard with its TaskControl
// state, and the fence that holds an entitlement still while it moves.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

// What the store keeps of a job, and puts back after a restart (the allocator's
// placement is restored separately, before).
struct PersistedJob {
  JobSpec spec;
  uint64_t generation = 1;
  bool stopping = false;
  JobProgress progress;
};

// A job as another shard needs it to carry on where this one stopped: what the store
// keeps and TaskControl's acknowledgements and moves under way (moved_job); taken in with
// its tasks, their machines this scheduler's ids (adopt_job: its lost and failed indices
// wait for replacements as after a restart). forget_job drops a job and its tasks without
// a command: they run on, another shard's now.
struct MovedJob {
  PersistedJob job;
  std::set<std::string> granted, moves;
  std::map<int, std::string> in_progress;
  bool fallback = false;
};

class Handover {
 public:
  explicit Handover(Scheduler& s) : s_(s) {}
  std::vector<PersistedJob> persisted_jobs() const;
  std::optional<PersistedJob> persisted_job(const std::string& name) const;
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
  // fenced() of a job's entitlement and of a machine's.
  bool job_fenced(const std::string& job) const;
  bool machine_fenced(MachineId m) const;
  std::optional<MovedJob> moved_job(const std::string& name) const;
  void adopt_job(const MovedJob& j, const std::vector<TaskRecord>& tasks);
  void forget_job(const std::string& name);

 private:
  Scheduler& s_;
  std::unordered_set<EntitlementId> fenced_;  // fence()
};

}  // namespace weft::cp
