// Periodic jobs' clock (docs/jobs.md, "Periodic jobs"). Every tick the leader starts the
// runs that are due: each period its job's cron schedule names, on the control plane's
// wall clock (UTC), after the job's last period. The run and the period's mark are one
// write (Scheduler::start_period), so a period runs once whichever control plane leads:
// a new leader (or a restarted one) carries on after the last period written, and runs
// the periods it missed meanwhile in turn, at most kCatchUp of them (older ones are
// skipped, each said in the job's events). A run still going when its next period comes
// is left alone, makes that period skipped, or is stopped for it, as the job's overlap
// says; with "allow", a period that comes while `max_running` runs are still going is
// skipped (issue 59: a run a second that never ended once filled its entitlement). The
// runs that ended are kept for `weftctl job show`: the latest kKeepSucceeded
// that succeeded and kKeepFailed that failed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/cron.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

class PeriodicRuns {
 public:
  static constexpr size_t kCatchUp = 10;
  static constexpr size_t kKeepSucceeded = 3, kKeepFailed = 1;

  // `wall_s`: the control plane's clock (unix seconds). Returns the commands to send
  // (the new runs' starts, the stops of runs replaced or forgotten).
  std::vector<Command> tick(Scheduler& s, int64_t wall_s, uint64_t now_us);
  // The wall clock stepped forward from `from_s` to `to_s` (WallClockSteps): the
  // periods it jumped over were not missed, so none of them runs but the latest (as
  // after a control plane's absence, where up to kCatchUp do); each job's events say so.
  // A step back needs nothing here: no period runs twice, and the schedule goes on once
  // the clock passes the last period run (as cron's does).
  void clock_stepped(Scheduler& s, int64_t from_s, int64_t to_s);
  // Reads the clocks each tick (WallClockSteps): a step forward is clock_stepped.
  // Returns the step (µs; > 0: forward), or 0 when none, for the caller's log.
  int64_t observe_clock(Scheduler& s, uint64_t monotonic_us, uint64_t wall_us);
  // The job's next period after `wall_s` (nullopt: no such job, or never).
  std::optional<int64_t> next_period(const Scheduler& s, const std::string& job, int64_t wall_s);

 private:
  const CronSchedule* schedule(const std::string& job, const std::string& text);
  std::map<std::string, std::pair<std::string, CronSchedule>> schedules_;  // by job
  WallClockSteps wall_steps_;
};

}  // namespace weft::cp
