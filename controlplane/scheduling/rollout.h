// The scheduler's rollouts (scheduler.h, docs/jobs.md "Rollouts"): an update's new spec
// rolled over the job's tasks max_unavailable at a time, after its machines fetched the
// new image; a job's revisions; pausing and resuming; the canary phase and its promotion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

class Rollouts {
 public:
  explicit Rollouts(Scheduler& s) : s_(s) {}
  // A new spec for a running job: tasks are replaced max_unavailable at a time. A job
  // that autoscales (before or after) keeps the size autoscaling gave it.
  Result<std::vector<Command>> update(const JobSpec& spec, uint64_t now_us);
  // Machine `m` answered the prefetch of `job`'s update `generation` (fetched, or
  // failed: either way its old tasks may roll now).
  std::vector<Command> prefetched(const std::string& job, uint64_t generation, MachineId m,
                                  uint64_t now_us);
  // Paused: no task is restarted for an update (an
  // operator's restart of one task still goes); resumed: it rolls on.
  Result<std::vector<Command>> pause_rollout(const std::string& job, bool paused, uint64_t now_us);
  // The canaries are good: the update rolls on to every task. A job without a canary
  // phase: refused.
  Result<std::vector<Command>> promote(const std::string& job, uint64_t now_us,
                                       const std::string& why);
  // Says who made the job's latest revision and how ("updated by CN=alice").
  void note_revision(const std::string& job, const std::string& note);

 private:
  friend class Scheduler;
  friend class Operations;
  // The job's tasks of an older generation (or an operator's restart) stopped as the
  // rollout allows, max_unavailable at a time; a controlled job's as acknowledged.
  std::vector<Command> roll(JobRecord& j, uint64_t now_us);
  // The job's spec as a new revision (create, update): the oldest beyond
  // kRevisionsKept goes. An update with canaries starts its canary phase.
  void add_revision(JobRecord& j, uint64_t now_us);
  // How many more tasks an update may restart now: none while paused, the canaries
  // left to start in a canary phase, else any number (the pacing is max_unavailable's).
  int restarts_allowed(const JobRecord& j) const;
  // Canary phases whose canaries have been ready for auto_promote: promoted.
  void auto_promote(uint64_t now_us, std::vector<Command>* out);
  // Updates whose prefetch deadline passed roll on without the machines still fetching.
  void roll_unfetched(uint64_t now_us, std::vector<Command>* out);

  Scheduler& s_;
};

}  // namespace weft::cp
