// The scheduler's batch and periodic jobs (scheduler.h, docs/jobs.md "Batch jobs" and
// "Periodic jobs"): completions counted, failures against a budget, the job's end at its
// deadline or outcome, and the runs of periodic jobs, each period once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

class BatchRuns {
 public:
  explicit BatchRuns(Scheduler& s) : s_(s) {}
  // A job's progress (nullopt: no job).
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

 private:
  friend class Scheduler;
  friend class Handover;
  // A task of batch job `j` ended: it exited 0 (a
  // completion) or failed (counted against max_failures).
  void task_ended(JobRecord& j, const TaskRecord& t, bool succeeded);
  // The job completed, failed past its budget or has a task that cannot start: it ends.
  void check(JobRecord& j, uint64_t now_us, std::vector<Command>* out);
  void end(JobRecord& j, const char* outcome, const std::string& reason, uint64_t now_us,
           std::vector<Command>* out);
  // Batch jobs past their deadline fail; restored ones fill their free slots (the tick).
  void tick(uint64_t now_us, std::vector<Command>* out);

  Scheduler& s_;
  // Batch jobs whose free slots need a look (restored, adopted): converged at the tick.
  std::set<std::string> idle_;
};

}  // namespace weft::cp
