// The ReBalancer's planner (controlplane/tend/rebalance_plan.h) on a fleet of real machines: the
// Alibaba cluster-trace-v2018 machines (../shared/data/alibaba-v2018-machine_meta.csv:
// each machine's last record; failure_domain_2 (21 values) as its fault domain, or
// failure_domain_1 (292) with --domain-level 1; cpu_num cores; the
// trace's memory is normalised 0-100, taken here as 100 = 256 GiB) in one entitlement,
// placed by weft's own allocator (controlplane/scheduling/allocator.h).
//
// The jobs are a synthesis (labelled as such in docs/benchmarks.md): `--steps` steps; at
// each, a job arrives with probability `--arrival` (tasks: lognormal, median 12, 1-200; a task
// of 0.5, 1, 2 or 4 cores, weights 4:3:2:1, 2 GiB a core; spread, 1 in 10 packed;
// max_unavailable a tenth of its tasks, at least 1; 1 in 20 opts out of the ReBalancer)
// and lives an exponential number of steps (mean `--life`); half way, the fault domain
// with the most machines fails (its tasks are moved by the allocator, as the control
// plane does) and returns `--down` steps later. Then:
//
//  - without the ReBalancer: the fleet as the allocator left it;
//  - with it: plans of `--budget` moves each, applied one after the other, until a plan
//    moves nothing or `--rounds` plans (local search: all three aims);
//  - consolidation alone, local search against the exact planner (GLPK, a neighbourhood
//    of `--neighbourhood` machines, `--time-limit` ms), on the same fleet.
//
// Each reports spread violations (tasks beyond their job's fair share of a domain),
// machines in use and empty (returnable to the free pool), CPU use's spread over the
// machines in use, moves and the planner's time. Every plan is checked: no job has more
// than max_unavailable tasks moving at once (a plan's moves go at once).
//
//   build/bench/rebalance [--machines 1000] [--steps 400] [--seed 1] [--budget 200]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "controlplane/scheduling/allocator.h"
#include "controlplane/tend/rebalance_plan.h"

namespace rb = weft::cp::rebalance;
using weft::cp::Allocator;
using weft::cp::MachineId;

namespace {

struct TraceMachine {
  std::string id, domain;
  int cores = 0;
  double mem = 0;
};

std::vector<TraceMachine> read_trace(const std::string& path, size_t want, bool level2) {
  std::ifstream in(path);
  std::map<std::string, TraceMachine> last;  // id -> its last record
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream s(line);
    std::vector<std::string> f;
    std::string cell;
    while (std::getline(s, cell, ',')) f.push_back(cell);
    if (f.size() < 7 || f[4].empty()) continue;
    TraceMachine m{f[0], level2 ? f[3] : f[2], std::atoi(f[4].c_str()), std::atof(f[5].c_str())};
    if (m.cores <= 0) continue;
    last[m.id] = m;
  }
  std::vector<TraceMachine> out;
  for (auto& [id, m] : last) {
    if (out.size() >= want) break;
    out.push_back(m);
  }
  return out;
}

struct Line {
  const char* what;
  rb::Score s;
  size_t moves = 0;
  double ms = 0;
};

void print(const Line& l) {
  std::printf("%-34s %9lld %8zu %8zu %9.3f %7zu %9.1f\n", l.what,
              static_cast<long long>(l.s.spread_violations), l.s.machines_used, l.s.machines_empty,
              l.s.cpu_stddev, l.moves, l.ms);
}

// A plan's moves of one job never exceed its max_unavailable (checked, not assumed).
bool within_unavailable(const rb::Fleet& f, const std::vector<rb::Move>& plan) {
  std::map<uint32_t, int> n;
  for (const auto& m : plan) ++n[f.tasks[m.task].job];
  for (const auto& [j, k] : n)
    if (k > std::max(1, f.jobs[j].max_unavailable)) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the ReBalancer's planner on the Alibaba 2018 machines"};
  std::string trace =
      std::string(WEFT_SOURCE_DIR) + "/../shared/data/alibaba-v2018-machine_meta.csv";
  size_t machines = 1000, budget = 200, rounds = 20, neighbourhood = 8;
  int steps = 800, down = 40;
  double life = 400, arrival = 0.9;
  std::string level = "2";
  unsigned seed = 1;
  int time_limit_ms = 2000;
  app.add_option("--trace", trace, "machine_meta.csv");
  app.add_option("--machines", machines, "machines taken from the trace");
  app.add_option("--steps", steps, "steps of arrivals and departures");
  app.add_option("--life", life, "a job's mean life, in steps");
  app.add_option("--arrival", arrival, "a job arrives at a step with this probability");
  app.add_option("--domain-level", level, "the trace's failure_domain_1 or _2 as fault domain")
      ->check(CLI::IsMember({"1", "2"}));
  app.add_option("--down", down, "steps the failed fault domain stays down");
  app.add_option("--seed", seed);
  app.add_option("--budget", budget, "moves a plan");
  app.add_option("--rounds", rounds, "plans, at most");
  app.add_option("--neighbourhood", neighbourhood, "the exact planner's machines");
  app.add_option("--time-limit", time_limit_ms, "the exact planner's limit, ms");
  CLI11_PARSE(app, argc, argv);

  auto trace_machines = read_trace(trace, machines, level == "2");
  if (trace_machines.empty()) {
    std::fprintf(stderr, "rebalance: no machine read from %s\n", trace.c_str());
    return 1;
  }
  Allocator alloc;
  std::map<std::string, std::vector<MachineId>> by_domain;
  for (const auto& m : trace_machines) {
    int64_t mem_mb = static_cast<int64_t>(m.mem / 100.0 * 256 * 1024);
    MachineId id = alloc.add_machine(
        {m.id, "dc1", m.domain, "std", {static_cast<int64_t>(m.cores) * 1000, mem_mb}});
    (void)alloc.assign(id, 1);
    by_domain[m.domain].push_back(id);
  }
  alloc.set_quota(1, trace_machines.size());

  // The synthesis.
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> size(std::log(12.0), 1.0);
  std::exponential_distribution<double> lifetime(1.0 / life);
  std::discrete_distribution<int> core_pick({4, 3, 2, 1});
  const int64_t cores_milli[] = {500, 1000, 2000, 4000};
  struct Live {
    weft::cp::Request r;
    int ends = 0;
    int max_unavailable = 1;
    bool opt_out = false;
  };
  std::map<std::string, Live> live;
  int refused = 0, made = 0;
  std::string failed_domain;
  size_t most = 0;
  for (const auto& [d, ms] : by_domain)
    if (ms.size() > most) {
      most = ms.size();
      failed_domain = d;
    }
  auto set_domain = [&](bool up) {
    for (MachineId m : by_domain[failed_domain]) alloc.set_usable(m, up, true);
    if (up) return;
    for (auto& [name, l] : live) {  // the allocator moves what ran there, as the control plane does
      auto placed = alloc.placement(name);
      std::vector<int> lost;
      for (size_t i = 0; i < placed.size(); ++i)
        for (MachineId m : by_domain[failed_domain])
          if (placed[i] == m) lost.push_back(static_cast<int>(i));
      if (!lost.empty()) (void)alloc.move_tasks(name, lost);
    }
  };
  for (int step = 0; step < steps; ++step) {
    for (auto it = live.begin(); it != live.end();)
      if (it->second.ends <= step) {
        alloc.release(it->first);
        it = live.erase(it);
      } else {
        ++it;
      }
    if (step == steps / 2) set_domain(false);
    if (step == steps / 2 + down) set_domain(true);
    if (std::uniform_real_distribution<double>(0, 1)(rng) >= arrival) continue;
    Live l;
    l.r.job = "job" + std::to_string(step);
    l.r.generation = 1;
    l.r.entitlement = 1;
    l.r.tasks = std::clamp(static_cast<int>(std::lround(size(rng))), 1, 200);
    int64_t cpu = cores_milli[core_pick(rng)];
    l.r.per_task = {cpu, cpu * 2};
    l.r.spread = rng() % 10 != 0;
    l.max_unavailable = std::max(1, l.r.tasks / 10);
    l.opt_out = rng() % 20 == 0;
    l.ends = step + 1 + static_cast<int>(lifetime(rng));
    if (alloc.allocate(l.r).ok()) {
      live[l.r.job] = l;
      ++made;
    } else {
      ++refused;
    }
  }

  // The snapshot the ReBalancer would see.
  rb::Fleet f;
  for (MachineId m = 0; m < alloc.machine_count(); ++m) {
    const auto& tm = trace_machines[m];
    f.machines.push_back(rb::Machine{tm.id, 0, static_cast<int64_t>(tm.cores) * 1000,
                                     static_cast<int64_t>(tm.mem / 100.0 * 256 * 1024), true});
  }
  std::map<std::string, uint32_t> domain_ids;
  for (MachineId m = 0; m < alloc.machine_count(); ++m)
    f.machines[m].domain =
        domain_ids.emplace(trace_machines[m].domain, static_cast<uint32_t>(domain_ids.size()))
            .first->second;
  size_t tasks = 0;
  for (const auto& [name, l] : live) {
    f.jobs.push_back(rb::Job{name, l.max_unavailable, l.r.spread, l.opt_out});
    auto placed = alloc.placement(name);
    for (size_t i = 0; i < placed.size(); ++i)
      f.tasks.push_back(rb::Task{name + "." + std::to_string(i),
                                 static_cast<uint32_t>(f.jobs.size() - 1), placed[i],
                                 l.r.per_task.cpu_milli, l.r.per_task.mem_mb});
    tasks += placed.size();
  }
  std::printf(
      "fleet: %zu Alibaba 2018 machines in %zu fault domains; synthesis: %d jobs placed (%d "
      "refused), %zu live with %zu tasks; domain %s (%zu machines) failed at step %d and "
      "returned at %d\n\n",
      f.machines.size(), domain_ids.size(), made, refused, live.size(), tasks,
      failed_domain.c_str(), most, steps / 2, steps / 2 + down);
  std::printf("%-34s %9s %8s %8s %9s %7s %9s\n", "", "spread", "used", "empty", "cpu sd", "moves",
              "plan ms");
  print(Line{"without the ReBalancer", rb::score(f), 0, 0});

  bool ok = true;
  auto run = [&](const char* what, bool exact, rb::Options o) {
    rb::Fleet g = f;
    size_t moves = 0;
    double ms = 0;
    std::string status;
    for (size_t r = 0; r < rounds; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto plan = exact ? rb::plan_exact(g, o, &status) : rb::plan_local(g, o);
      ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!within_unavailable(g, plan)) {
        std::printf("PLAN BROKE max_unavailable (%s)\n", what);
        ok = false;
      }
      if (plan.empty()) break;
      rb::apply_moves(g, plan);
      moves += plan.size();
    }
    print(Line{what, rb::score(g), moves, ms});
    if (exact) std::printf("%34s (GLPK: %s)\n", "", status.c_str());
  };
  rb::Options all;
  all.move_budget = budget;
  run("with it (local search, all aims)", false, all);
  rb::Options cons = all;
  cons.balance_gap = 10;  // no balancing: consolidation alone, as the exact planner
  cons.move_budget = budget;
  cons.neighbourhood = neighbourhood;
  cons.max_candidates = neighbourhood;  // the same machines considered a plan
  cons.time_limit_us = static_cast<uint64_t>(time_limit_ms) * 1000;
  run("consolidation: local search", false, cons);
  run("consolidation: exact (GLPK)", true, cons);
  return ok ? 0 : 1;
}
