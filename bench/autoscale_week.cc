// A week of load through autoscaling's decisions (controlplane/tend/autoscaler.h): the
// proportional rule alone (Kubernetes' HPA, its defaults) against the same with the
// forecast (Twine's SRM), on the same load, side by side.
//
// The load is a synthesis, shipped here: a day of 5 units at night rising over an hour
// from 8:00 to a plateau (30 units on weekdays, 10 at weekends) until 17:00, falling over
// an hour; multiplied by 1 + N(0, `noise`) every sample, seeded. A task serves at most
// 1 unit (its limit) and the job runs at `target` units a task (70%); a new task is
// ready `start` seconds after it is asked for (the image is local: a process and its
// warm-up); tasks asked away go at once. The metric the decisions see is the load the
// ready tasks serve: at most 1 unit each, as a CPU metric saturates at the limit.
//
// Decisions are made every 15 s. The first `warmup` days give the forecast its history
// (both run through them); the figures are over the 7 days after: task-hours, the time
// the job ran under its target capacity (ready tasks × target < load) and the time it
// was overloaded (ready tasks × 1 < load: requests beyond the tasks' limits).
//
//   build/bench/autoscale_week [--noise 0.05] [--start 60] [--lead 0] [--csv FILE]
//                              [--seeds N]   (N seeds from --seed: each and the means)
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "controlplane/tend/autoscaler.h"
#include "controlplane/tend/week_load.h"

using weft::cp::AutoscaleDecision;
using weft::cp::AutoscalePolicy;
using weft::cp::Autoscaler;
using weft::cp::weekly_load;

namespace {

constexpr uint64_t kSec = 1'000'000;
constexpr uint64_t kHour = 3600 * kSec;
constexpr uint64_t kDay = 24 * kHour;

struct Result {
  double task_hours = 0, under_target_h = 0, overloaded_h = 0;
  int64_t changes = 0;
};

struct Run {
  Autoscaler a;
  int64_t desired = 0;
  std::deque<uint64_t> starting;  // when each task asked for becomes ready
  int64_t ready = 0;
  Result r;
};

struct Settings {
  double noise = 0.05, target = 0.7;
  int start_s = 60, lead_s = 0, warmup_days = 8;
};

// One week (after the warm-up) of both rules on one seed's load.
std::pair<Result, Result> simulate(const Settings& s, int seed, const std::string& csv) {
  AutoscalePolicy base;
  base.min = 2;
  base.max = 200;
  base.target = s.target;
  AutoscalePolicy pred = base;
  pred.predictive = true;
  pred.lead_us = static_cast<uint64_t>(s.lead_s) * kSec;
  Run runs[2] = {Run{Autoscaler(base), 8, {}, 8, {}}, Run{Autoscaler(pred), 8, {}, 8, {}}};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<double> jitter(0, s.noise);
  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "t_hours,load,hpa_tasks,predictive_tasks\n";
  }
  const uint64_t step = 15 * kSec;
  const uint64_t measured_from = static_cast<uint64_t>(s.warmup_days) * kDay;
  const uint64_t end = measured_from + 7 * kDay;
  const double step_h = static_cast<double>(step) / static_cast<double>(kHour);
  for (uint64_t t = 0; t < end; t += step) {
    double load = std::max(0.0, weekly_load(t) * (1 + jitter(rng)));
    for (Run& run : runs) {
      while (!run.starting.empty() && run.starting.front() <= t) {
        run.starting.pop_front();
        ++run.ready;
      }
      double served = std::min(load, static_cast<double>(run.ready));
      run.a.observe(t, served, run.ready);
      AutoscaleDecision d = run.a.decide(t, run.desired, base.max);
      if (d.desired != run.desired) {
        run.a.changed(t, run.desired, d.desired);
        if (t >= measured_from) ++run.r.changes;
        if (d.desired > run.desired) {
          for (int64_t i = run.desired; i < d.desired; ++i)
            run.starting.push_back(t + static_cast<uint64_t>(s.start_s) * kSec);
        } else {
          // Those still starting go first, then ready ones.
          int64_t drop = run.desired - d.desired;
          while (drop > 0 && !run.starting.empty()) {
            run.starting.pop_back();
            --drop;
          }
          run.ready -= drop;
        }
        run.desired = d.desired;
      }
      if (t >= measured_from) {
        run.r.task_hours += static_cast<double>(run.desired) * step_h;
        if (static_cast<double>(run.ready) * s.target < load) run.r.under_target_h += step_h;
        if (static_cast<double>(run.ready) < load) run.r.overloaded_h += step_h;
      }
    }
    if (out && t % (300 * kSec) == 0)
      out << static_cast<double>(t) / static_cast<double>(kHour) << ',' << load << ','
          << runs[0].desired << ',' << runs[1].desired << '\n';
  }
  return {runs[0].r, runs[1].r};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A week of load through autoscaling's decisions: HPA's rule against the forecast"};
  Settings s;
  int seed = 46, seeds = 1;
  std::string csv;
  app.add_option("--noise", s.noise, "relative noise of each sample (standard deviation)");
  app.add_option("--target", s.target, "the load a task runs at (a task serves at most 1)");
  app.add_option("--start", s.start_s, "seconds from a task asked for to its being ready");
  app.add_option("--lead", s.lead_s,
                 "how far beyond the current 5-minute slot the forecast looks, seconds");
  app.add_option("--warmup", s.warmup_days, "days of history before the measured week");
  app.add_option("--seed", seed, "the noise's seed");
  app.add_option("--seeds", seeds, "run this many seeds from --seed, and their means")
      ->check(CLI::Range(1, 1000));
  app.add_option("--csv", csv, "t_hours,load,hpa_tasks,predictive_tasks every 5 minutes");
  CLI11_PARSE(app, argc, argv);

  std::printf(
      "a week of load (weekdays 5 -> 30 units, weekends 5 -> 10, noise %.0f%%), target %.2f a "
      "task, tasks ready %d s after asked, forecast %s, after %d days of history:\n",
      s.noise * 100, s.target, s.start_s,
      s.lead_s ? ("to " + std::to_string(s.lead_s / 60) + " min ahead").c_str()
               : "of the current slot",
      s.warmup_days);
  double sum_hours = 0, sum_under = 0;
  int met = 0;
  for (int k = 0; k < seeds; ++k) {
    auto [hpa, fc] = simulate(s, seed + k, k == 0 ? csv : std::string());
    const char* names[] = {"proportional rule (HPA defaults)", "with the forecast"};
    const Result* rs[] = {&hpa, &fc};
    if (seeds > 1) std::printf(" seed %d\n", seed + k);
    for (int i = 0; i < 2; ++i)
      std::printf(
          "  %-34s task-hours %8.1f | under target capacity %6.2f h | overloaded %6.2f h | "
          "%lld changes\n",
          names[i], rs[i]->task_hours, rs[i]->under_target_h, rs[i]->overloaded_h,
          static_cast<long long>(rs[i]->changes));
    double hours = fc.task_hours / hpa.task_hours;
    double under = hpa.under_target_h > 0 ? fc.under_target_h / hpa.under_target_h : 0.0;
    std::printf("  forecast / proportional: task-hours %.3fx, under target capacity %.3fx\n", hours,
                under);
    sum_hours += hours;
    sum_under += under;
    met += hours <= 1.0 && under < 1.0;
  }
  if (seeds > 1)
    std::printf(
        "over %d seeds: task-hours %.4fx, under target capacity %.3fx (means); both better "
        "or equal in %d of %d\n",
        seeds, sum_hours / seeds, sum_under / seeds, met, seeds);
  return 0;
}
