#include "controlplane/jobs/periodic.h"

#include "common/log.h"

namespace weft::cp {

const CronSchedule* PeriodicRuns::schedule(const std::string& job, const std::string& text) {
  auto it = schedules_.find(job);
  if (it != schedules_.end() && it->second.first == text) return &it->second.second;
  auto parsed = parse_cron(text);
  if (!parsed.ok()) return nullptr;  // (the job validator accepted it: never here)
  return &(schedules_[job] = {text, *parsed}).second;
}

std::optional<int64_t> PeriodicRuns::next_period(const Scheduler& s, const std::string& job,
                                                 int64_t wall_s) {
  auto spec = s.job(job);
  if (!spec || !spec->periodic) return std::nullopt;
  const CronSchedule* c = schedule(job, spec->periodic->schedule);
  return c ? c->next_after(wall_s) : std::nullopt;
}

int64_t PeriodicRuns::observe_clock(Scheduler& s, uint64_t monotonic_us, uint64_t wall_us) {
  int64_t step = wall_steps_.observe(monotonic_us, wall_us);
  if (step > 0)
    clock_stepped(s, static_cast<int64_t>((wall_us - static_cast<uint64_t>(step)) / 1'000'000),
                  static_cast<int64_t>(wall_us / 1'000'000));
  return step;
}

void PeriodicRuns::clock_stepped(Scheduler& s, int64_t from_s, int64_t to_s) {
  constexpr int kMaxWalk = 2'000'000;  // a year of a schedule a minute, and more
  for (const auto& [name, running] : s.batch().periodic_jobs()) {
    auto spec = s.job(name);
    auto progress = s.batch().progress(name);
    if (!spec || !spec->periodic || !progress || progress->last_period == 0) continue;
    const CronSchedule* c = schedule(name, spec->periodic->schedule);
    if (!c) continue;
    // The periods after the last one run and after the clock's reading before the step,
    // up to its reading after: all but the latest are skipped.
    std::optional<int64_t> before_latest, latest;
    int walked = 0;
    for (auto p = c->next_after(std::max(progress->last_period, from_s));
         p && *p <= to_s && walked < kMaxWalk; p = c->next_after(*p), ++walked) {
      before_latest = latest;
      latest = p;
    }
    if (!before_latest) continue;
    s.batch().skip_period(name, *before_latest,
                          "the wall clock stepped forward by " + std::to_string(to_s - from_s) +
                              " s: the periods it jumped over up to " +
                              std::to_string(*before_latest) + " are not run; the latest runs");
  }
}

std::vector<Command> PeriodicRuns::tick(Scheduler& s, int64_t wall_s, uint64_t now) {
  std::vector<Command> out;
  auto jobs = s.batch().periodic_jobs();
  for (auto it = schedules_.begin(); it != schedules_.end();)  // jobs that went
    it = jobs.count(it->first) ? std::next(it) : schedules_.erase(it);
  for (auto& [name, running] : jobs) {
    auto spec = s.job(name);
    auto progress = s.batch().progress(name);
    if (!spec || !spec->periodic || !progress) continue;
    if (progress->last_period == 0) {  // a job created without its first mark: from now on
      s.batch().skip_period(name, wall_s, "");
      continue;
    }
    const CronSchedule* c = schedule(name, spec->periodic->schedule);
    if (!c) continue;
    std::vector<int64_t> due;
    for (auto p = c->next_after(progress->last_period); p && *p <= wall_s; p = c->next_after(*p))
      due.push_back(*p);
    if (due.size() > kCatchUp) {
      size_t missed = due.size() - kCatchUp;
      s.batch().skip_period(name, due[missed - 1],
                            std::to_string(missed) + " periods up to " +
                                std::to_string(due[missed - 1]) +
                                " were missed (no control plane led meanwhile); the latest " +
                                std::to_string(kCatchUp) + " run in turn");
      due.erase(due.begin(), due.begin() + static_cast<std::ptrdiff_t>(missed));
    }
    for (int64_t p : due) {
      if (!running.empty() && spec->periodic->overlap == weft::PeriodOverlap::kForbid) {
        s.batch().skip_period(name, p,
                              "period " + std::to_string(p) + ": overlap forbidden, " +
                                  running.front() + " still runs");
        continue;
      }
      if (running.size() >= static_cast<size_t>(spec->periodic->max_running) &&
          spec->periodic->overlap == weft::PeriodOverlap::kAllow) {
        s.batch().skip_period(name, p,
                              "period " + std::to_string(p) + ": " +
                                  std::to_string(running.size()) +
                                  " runs still going, as many as max_running allows (the oldest " +
                                  running.front() + ")");
        continue;
      }
      if (!running.empty() && spec->periodic->overlap == weft::PeriodOverlap::kReplace) {
        for (const auto& run : running)
          if (auto stopped = s.stop(run, now); stopped.ok())
            out.insert(out.end(), stopped->begin(), stopped->end());
        running.clear();
      }
      auto started = s.batch().start_period(name, p, now);
      if (!started.ok()) {
        // No room now, say: the period stays due and is tried again at the next tick.
        log_warn("a periodic job's run cannot start yet",
                 {{"JOB", name}, {"PERIOD", std::to_string(p)}, {"ERROR", started.error().str()}});
        break;
      }
      out.insert(out.end(), started->begin(), started->end());
      running.push_back(weft::period_run_name(name, p));
    }
    // The history it keeps: the latest runs that succeeded and that failed.
    std::vector<std::string> ok, failed;
    for (const auto& run : s.batch().ended_runs(name)) {
      auto p = s.batch().progress(run);
      (p && p->outcome == "succeeded" ? ok : failed).push_back(run);
    }
    for (auto [runs, keep] : {std::pair{&ok, kKeepSucceeded}, std::pair{&failed, kKeepFailed}})
      for (size_t i = 0; i + keep < runs->size(); ++i)
        if (auto stopped = s.stop((*runs)[i], now); stopped.ok())
          out.insert(out.end(), stopped->begin(), stopped->end());
  }
  return out;
}

}  // namespace weft::cp
