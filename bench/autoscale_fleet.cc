// Twine's Fig. 15 and Fig. 18 in weft's terms: an autoscaled job following its load
// over a week, and the machines its entitlement takes from the free pool and gives back
// because of it (each one that joins applies the entitlement's host profile: a profile
// switch).
//
// The control plane's own parts run here in simulated time, without the network: the
// Allocator and the Scheduler (placement, scale-ups onto free machines, scale-downs),
// autoscaling's decision rules (controlplane/tend/autoscaler.h, the forecast's history filled
// by `warmup` days of the same load first) and the ReBalancer's loop
// (controlplane/tend/rebalancer.h, its real rounds every minute with the shipped budgets).
// What is simulated is the machines: a task started is running at once and ready
// `start` seconds later; a task stopped is gone at once; machines report every step.
//
// The load is bench/autoscale_week's synthesis (controlplane/tend/week_load.h) times
// `scale`: weekdays 5 -> 30 units, weekends 5 -> 10, noise 5%, seeded. A task of 2 cores
// serves at most 1 unit and the job runs at 0.7 a task; the machines: `machines` of 16
// cores in 6 fault domains, all in the free pool, the entitlement's quota 40.
//
// Three runs on the same load: the forecast with the ReBalancer, the forecast without
// it, and the proportional rule (HPA's) with it. Each prints its task-hours, time under
// target capacity, the entitlement's machine-hours and the machines it took and gave
// back; --csv writes the first run's time series (every 5 minutes).
//
//   build/bench/autoscale_fleet [--scale 4] [--machines 48] [--start 60] [--csv FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/event.h"
#include "controlplane/tend/autoscaler.h"
#include "controlplane/tend/rebalancer.h"
#include "controlplane/tend/week_load.h"

using namespace weft::cp;

namespace {

constexpr uint64_t kSec = 1'000'000;
constexpr uint64_t kMin = 60 * kSec;
constexpr uint64_t kHour = 60 * kMin;
constexpr uint64_t kDay = 24 * kHour;
constexpr EntitlementId kEnt = 1;

struct Settings {
  double scale = 4, noise = 0.05, target = 0.7;
  int machines = 48, start_s = 60, warmup_days = 8, seed = 46;
};

struct Figures {
  double task_hours = 0, under_target_h = 0, machine_hours = 0;
  int64_t joined = 0, returned = 0, moves = 0, peak_machines = 0, night_machines = 0;
  int64_t peak_tasks = 0;
};

// One run: the fleet, the job, the decisions, the ReBalancer (or not).
class Run {
 public:
  Run(const Settings& s, bool predictive, bool rebalance, weft::EventLoop& loop)
      : s_(s), rebalance_(rebalance) {
    for (int i = 0; i < s.machines; ++i)
      alloc_.add_machine(
          {"m" + std::to_string(i), "dc1", "d" + std::to_string(i % 6), "std", {16000, 65536}});
    alloc_.set_quota(kEnt, 40);
    AutoscalePolicy p;
    p.min = 4;
    p.max = 400;
    p.target = s.target;
    p.predictive = predictive;
    scaler_ = std::make_unique<Autoscaler>(p);
    Rebalancer::Hooks hooks;
    hooks.entitlements = [] { return std::vector<Rebalancer::Entitlement>{{kEnt, "web", false}}; };
    hooks.move = [this](const std::string& task, MachineId to, const std::string& reason) {
      bool joined = false;  // a spare joins first, as in the daemon
      if (auto st = join_spare(alloc_, sched_, task, to, &joined); !st.ok()) return st;
      auto cmds = sched_.moves().move_task(task, to, reason, now_);
      if (!cmds.ok()) {
        if (joined) (void)alloc_.assign(to, kFreePool);
        return weft::Status(std::move(cmds).error());
      }
      apply(*cmds);
      return weft::Status{};
    };
    hooks.moved = [this](const std::string&, const Rebalancer::Event&) { ++f_.moves; };
    rebalancer_ =
        std::make_unique<Rebalancer>(loop, alloc_, sched_, Rebalancer::Options{}, std::move(hooks));
  }

  // The forecast's history: `days` of the load, as if the job had followed it.
  void warm_up(const std::vector<double>& load, uint64_t step) {
    for (size_t i = 0; i < load.size(); ++i) {
      int64_t n = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(load[i] / s_.target)));
      scaler_->observe(i * step, load[i], n);
    }
  }

  void start(uint64_t now) {
    now_ = now;
    JobSpec j;
    j.name = "api";
    j.entitlement = "web";
    j.entitlement_id = kEnt;
    j.count = 8;
    j.max_unavailable = 2;
    j.per_task = {2000, 2048};
    j.task = {{"argv", {"/bin/sleep", "infinity"}}};
    auto c = sched_.create(j, now);
    if (!c.ok()) {
      std::fprintf(stderr, "create: %s\n", c.error().str().c_str());
      std::exit(1);
    }
    apply(*c);
    count_moved();
  }

  // One step of `step` at `now` with `load`; `measure`: the figures count it.
  void step(uint64_t now, double load, uint64_t step, bool measure) {
    now_ = now;
    report_all();
    int64_t ready = 0;
    for (const auto& [id, t] : sched_.tasks()) ready += available(t);
    double served = std::min(load, static_cast<double>(ready));
    scaler_->observe(now, served, ready);
    int64_t current = sched_.target_count("api");
    AutoscaleDecision d = scaler_->decide(now, current, 400);
    if (d.desired != current) {
      auto cmds = sched_.scale("api", static_cast<int>(d.desired), now);
      if (cmds.ok()) {
        scaler_->changed(now, current, d.desired);
        apply(*cmds);
      }
    }
    apply(sched_.tick(now));
    if (rebalance_ && now % kMin == 0) rebalancer_->round_at(now);
    count_moved();
    if (!measure) return;
    const double h = static_cast<double>(step) / static_cast<double>(kHour);
    const int64_t tasks = sched_.target_count("api");
    const int64_t machines = static_cast<int64_t>(alloc_.pool(kEnt).machines);
    f_.task_hours += static_cast<double>(tasks) * h;
    f_.machine_hours += static_cast<double>(machines) * h;
    if (static_cast<double>(ready) * s_.target < load) f_.under_target_h += h;
    f_.peak_machines = std::max(f_.peak_machines, machines);
    f_.peak_tasks = std::max(f_.peak_tasks, tasks);
    uint64_t tod = now % kDay;
    if (tod == 4 * kHour) f_.night_machines = std::max(f_.night_machines, machines);
    counting_ = true;
  }

  int64_t tasks() const { return sched_.target_count("api"); }
  int64_t machines() const { return static_cast<int64_t>(alloc_.pool(kEnt).machines); }
  const Figures& figures() const { return f_; }

 private:
  // The machines do what they are told: a start runs at once (ready `start` later), a
  // stop is gone at once.
  void apply(const std::vector<Command>& cmds) {
    for (const auto& c : cmds) {
      if (c.kind == Command::Kind::kStart)
        on_[c.machine][c.task_id] = now_ + static_cast<uint64_t>(s_.start_s) * kSec;
      else if (c.kind == Command::Kind::kStop)
        on_[c.machine].erase(c.task_id);
    }
  }
  void report_all() {
    for (int round = 0; round < 3; ++round) {  // what a report causes is reported too
      std::vector<Command> out;
      for (auto& [m, tasks] : on_) {
        std::map<std::string, weft::TaskState> r;
        for (const auto& [id, ready_at] : tasks)
          r[id] = now_ >= ready_at ? weft::TaskState::kReady : weft::TaskState::kRunning;
        auto more = sched_.report(m, r, now_);
        out.insert(out.end(), more.begin(), more.end());
      }
      if (out.empty()) break;
      apply(out);
    }
  }
  void count_moved() {
    for (MachineId m : alloc_.take_moved()) {
      if (!counting_) continue;
      (alloc_.entitlement_of(m) == kEnt ? f_.joined : f_.returned)++;
    }
    (void)alloc_.take_changed_jobs();
    (void)sched_.take_dirty_tasks();
    (void)sched_.take_changed_jobs();
    (void)sched_.take_reported_changes();
    (void)sched_.take_service_changes();
  }

  Settings s_;
  bool rebalance_;
  Allocator alloc_;
  Scheduler sched_{alloc_, SchedulerLimits{60, 20}};
  std::unique_ptr<Autoscaler> scaler_;
  std::unique_ptr<Rebalancer> rebalancer_;
  std::map<MachineId, std::map<std::string, uint64_t>> on_;  // task -> when it is ready
  uint64_t now_ = 0;
  bool counting_ = false;
  Figures f_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"An autoscaled job and its entitlement's machines over a week (Fig. 15, 18)"};
  Settings s;
  std::string csv;
  app.add_option("--scale", s.scale, "the load's multiplier (weekdays 5*scale -> 30*scale)");
  app.add_option("--machines", s.machines, "machines of 16 cores, in the free pool at first");
  app.add_option("--start", s.start_s, "seconds from a task started to its being ready");
  app.add_option("--seed", s.seed, "the noise's seed");
  app.add_option("--csv", csv, "t_hours,load,tasks,machines of the first run, every 5 minutes");
  bool check = false;
  app.add_flag("--check", check,
               "exit 1 unless the ReBalancer at least halves the machines held at night and the "
               "forecast spends less time under target than the proportional rule (CI)");
  CLI11_PARSE(app, argc, argv);

  auto loop = weft::EventLoop::create();
  if (!loop.ok()) {
    std::fprintf(stderr, "%s\n", loop.error().str().c_str());
    return 1;
  }
  const uint64_t step = 15 * kSec;
  const uint64_t from = static_cast<uint64_t>(s.warmup_days) * kDay, end = from + 7 * kDay;
  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  std::normal_distribution<double> jitter(0, s.noise);
  std::vector<double> load;
  for (uint64_t t = 0; t < end; t += step)
    load.push_back(std::max(0.0, s.scale * weft::cp::weekly_load(t) * (1 + jitter(rng))));

  struct Case {
    const char* name;
    bool predictive, rebalance;
  };
  const Case cases[] = {{"forecast + ReBalancer", true, true},
                        {"forecast, no ReBalancer", true, false},
                        {"proportional + ReBalancer", false, true}};
  std::printf(
      "a week: load %.0f -> %.0f units on weekdays, %.0f -> %.0f at weekends (noise %.0f%%), "
      "0.7 a task of 2 cores, tasks ready %d s after started; %d machines of 16 cores in 6 "
      "domains, the entitlement's quota 40\n",
      5 * s.scale, 30 * s.scale, 5 * s.scale, 10 * s.scale, s.noise * 100, s.start_s, s.machines);
  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "t_hours,load,tasks,machines\n";
  }
  // Hourly means of the first run's weekdays, for the plot.
  std::vector<double> hour_load(24), hour_tasks(24), hour_machines(24);
  std::vector<int> hour_n(24);
  std::vector<Figures> figures;
  for (size_t k = 0; k < std::size(cases); ++k) {
    Run run(s, cases[k].predictive, cases[k].rebalance, **loop);
    run.warm_up(std::vector<double>(load.begin(), load.begin() + static_cast<long>(from / step)),
                step);
    run.start(from);
    for (uint64_t t = from; t < end; t += step) {
      double l = load[t / step];
      run.step(t, l, step, true);
      if (k == 0 && t % (5 * kMin) == 0) {
        if (out)
          out << static_cast<double>(t - from) / kHour << ',' << l << ',' << run.tasks() << ','
              << run.machines() << '\n';
        uint64_t day = (t / kDay) % 7;
        if (day < 5) {  // weekdays (autoscale_load.h: days 0-4 of each week)
          int h = static_cast<int>((t % kDay) / kHour);
          hour_load[h] += l;
          hour_tasks[h] += static_cast<double>(run.tasks());
          hour_machines[h] += static_cast<double>(run.machines());
          ++hour_n[h];
        }
      }
    }
    const Figures& f = run.figures();
    figures.push_back(f);
    std::printf(
        "  %-27s task-hours %7.1f | under target %5.2f h | machine-hours %6.1f | machines "
        "%lld at peak, %lld at 4:00 | joined %lld, returned %lld | ReBalancer moves %lld\n",
        cases[k].name, f.task_hours, f.under_target_h, f.machine_hours,
        static_cast<long long>(f.peak_machines), static_cast<long long>(f.night_machines),
        static_cast<long long>(f.joined), static_cast<long long>(f.returned),
        static_cast<long long>(f.moves));
  }
  std::printf("\nweekday hours (the first run's means): load, tasks, machines\n");
  for (int h = 0; h < 24; ++h) {
    if (!hour_n[h]) continue;
    double n = hour_n[h];
    int bar = static_cast<int>(hour_machines[h] / n + 0.5);
    std::printf("  %02d:00 %6.1f %6.1f %5.1f  %s\n", h, hour_load[h] / n, hour_tasks[h] / n,
                hour_machines[h] / n, std::string(static_cast<size_t>(bar), '#').c_str());
  }
  if (check) {
    bool ok = true;
    auto expect = [&](bool cond, const char* what) {
      if (!cond) std::printf("CHECK FAILED: %s\n", what);
      ok = ok && cond;
    };
    expect(figures[0].night_machines * 2 <= figures[1].night_machines,
           "the ReBalancer halves the machines held at 4:00");
    expect(figures[0].machine_hours < figures[1].machine_hours,
           "the ReBalancer lowers the entitlement's machine-hours");
    expect(figures[0].under_target_h < figures[2].under_target_h,
           "the forecast is less time under target than the proportional rule");
    expect(figures[0].peak_tasks > 150, "the job grows to its weekday peak");
    return ok ? 0 : 1;
  }
  return 0;
}
