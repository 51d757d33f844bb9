#include "controlplane/tend/rebalance_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace weft::cp::rebalance {
namespace {

Fleet machines(int domains, int per_domain, int64_t cpu = 4000, int64_t mem = 8192) {
  Fleet f;
  for (int d = 0; d < domains; ++d)
    for (int i = 0; i < per_domain; ++i)
      f.machines.push_back(Machine{"m" + std::to_string(d) + "-" + std::to_string(i),
                                   static_cast<uint32_t>(d), cpu, mem, true});
  return f;
}

uint32_t add_job(Fleet& f, const std::string& name, int max_unavailable, bool spread = true) {
  f.jobs.push_back(Job{name, max_unavailable, spread, false});
  return static_cast<uint32_t>(f.jobs.size() - 1);
}

void add_task(Fleet& f, uint32_t job, uint32_t machine, int64_t cpu, int64_t mem = 64) {
  f.tasks.push_back(
      Task{f.jobs[job].name + "." + std::to_string(f.tasks.size()), job, machine, cpu, mem});
}

// What every plan must keep: capacity, opt-outs, max_unavailable, the budget, each task
// moved at most once, and no worse spread.
void check_plan(const Fleet& before, const std::vector<Move>& plan, const Options& o) {
  EXPECT_LE(plan.size(), o.move_budget);
  Fleet after = before;
  apply_moves(after, plan);
  std::map<uint32_t, int> moved;
  std::set<uint32_t> tasks;
  for (const auto& m : plan) {
    EXPECT_TRUE(tasks.insert(m.task).second) << "task moved twice in a plan";
    EXPECT_EQ(before.tasks[m.task].machine, m.from);
    EXPECT_NE(m.from, m.to);
    EXPECT_TRUE(before.machines[m.to].usable);
    EXPECT_FALSE(before.jobs[before.tasks[m.task].job].opt_out);
    ++moved[before.tasks[m.task].job];
  }
  for (const auto& [j, n] : moved) EXPECT_LE(n, std::max(1, before.jobs[j].max_unavailable));
  std::vector<int64_t> cpu(after.machines.size()), mem(after.machines.size());
  for (const auto& t : after.tasks) {
    cpu[t.machine] += t.cpu_milli;
    mem[t.machine] += t.mem_mb;
  }
  for (size_t m = 0; m < after.machines.size(); ++m)
    if (!plan.empty()) {
      bool touched = false;
      for (const auto& mv : plan) touched |= mv.to == m;
      if (!touched) continue;
      EXPECT_LE(cpu[m], after.machines[m].cpu_milli) << after.machines[m].name;
      EXPECT_LE(mem[m], after.machines[m].mem_mb) << after.machines[m].name;
    }
  EXPECT_LE(score(after).spread_violations, score(before).spread_violations);
}

// After a fault domain failed and came back, a job's tasks are crowded in the others:
// the plan spreads them again, at most max_unavailable at a time.
TEST(Rebalance, SpreadIsRestoredAtMostMaxUnavailableAPlan) {
  Fleet f = machines(3, 2);
  uint32_t j = add_job(f, "web", 2);
  for (int i = 0; i < 6; ++i) add_task(f, j, static_cast<uint32_t>(i % 2), 500);  // all in domain 0
  EXPECT_EQ(score(f).spread_violations, 4);  // 6 in one domain, a share of 2
  Options o;
  auto plan = plan_local(f, o);
  check_plan(f, plan, o);
  ASSERT_EQ(plan.size(), 2u);
  for (const auto& m : plan) EXPECT_EQ(m.aim, Aim::kSpread);
  apply_moves(f, plan);
  EXPECT_EQ(score(f).spread_violations, 2);
  auto next = plan_local(f, o);
  check_plan(f, next, o);
  apply_moves(f, next);
  EXPECT_EQ(score(f).spread_violations, 0);
}

// Two lightly used machines are emptied onto the two busy ones (best fit), which the
// entitlement then gives back; the exact planner finds the same.
TEST(Rebalance, LightMachinesAreEmptiedForTheFreePool) {
  Fleet f = machines(1, 4);
  uint32_t a = add_job(f, "a", 4, false), b = add_job(f, "b", 4, false);
  add_task(f, a, 0, 3000);
  add_task(f, b, 1, 3000);
  add_task(f, a, 2, 500);
  add_task(f, b, 3, 900);
  Options o;
  o.fill = 1.0;  // (the default keeps 15% of each machine free)
  auto plan = plan_local(f, o);
  check_plan(f, plan, o);
  Fleet local = f;
  apply_moves(local, plan);
  EXPECT_EQ(score(local).machines_empty, 2u);
  for (const auto& m : plan) EXPECT_EQ(m.aim, Aim::kFree);
  std::string status;
  auto exact = plan_exact(f, o, &status);
  EXPECT_EQ(status, "optimal");
  check_plan(f, exact, o);
  Fleet ex = f;
  apply_moves(ex, exact);
  EXPECT_EQ(score(ex).machines_empty, 2u);
  EXPECT_EQ(exact.size(), 2u);
}

// A job that opted out is never moved; a machine holding one of its tasks stays.
// Spares (free-pool machines the entitlement may take): only spread moves use one, never
// consolidation or balance; a swap-only spare (no room under the quota) only takes a task
// alone on its machine, and one a plan.
TEST(Rebalance, SparesServeSpreadOnlyAndSwapsTakeALoneTask) {
  Fleet f = machines(1, 3);  // m0-0, m0-1, m0-2 in domain 0: the entitlement's
  for (int i = 0; i < 2; ++i) {
    f.machines.push_back(Machine{"spare" + std::to_string(i), 1, 4000, 8192, true, true});
  }
  uint32_t web = add_job(f, "web", 2);
  uint32_t db = add_job(f, "db", 2);
  add_task(f, web, 0, 500);
  add_task(f, web, 0, 500);  // web: two tasks on m0-0, both in domain 0 (cap 1)
  add_task(f, db, 1, 500);
  add_task(f, db, 2, 500);  // db: one task each on m0-1 and m0-2
  Options o;
  auto plan = plan_local(f, o);
  check_plan(f, plan, o);
  // The first move onto a spare is a spread move (others may follow it there: it is the
  // entitlement's then).
  auto first_onto_spares = [&](const std::vector<Move>& p) {
    std::map<uint32_t, Move> first;
    for (const auto& m : p)
      if (f.machines[m.to].spare) first.emplace(m.to, m);
    return first;
  };
  int spread = 0;
  for (const auto& [to, m] : first_onto_spares(plan)) EXPECT_EQ(m.aim, Aim::kSpread);
  for (const auto& m : plan) spread += m.aim == Aim::kSpread;
  EXPECT_EQ(spread, 2);  // one of web's and one of db's go to the other domain
  Fleet after = f;
  apply_moves(after, plan);
  EXPECT_EQ(score(after).spread_violations, 0);
  EXPECT_EQ(score(f).machines_empty, 0u);  // spares are not the entitlement's empty machines

  // No room: the spares are for swaps. web's tasks share m0-0: neither may go; db's are
  // alone on theirs: one goes (one swap a plan).
  for (auto& m : f.machines)
    if (m.spare) m.swap_only = true;
  plan = plan_local(f, o);
  check_plan(f, plan, o);
  auto swaps = first_onto_spares(plan);
  ASSERT_EQ(swaps.size(), 1u);
  const Move& swap = swaps.begin()->second;
  EXPECT_EQ(swap.aim, Aim::kSpread);
  EXPECT_EQ(f.jobs[f.tasks[swap.task].job].name, "db");
}

// What a machine of another fault domain would help: a violation's domain, and a job's
// most crowded domain when one more domain would lower its share; not a job as spread
// as one more domain could make it, nor one that opted out.
TEST(Rebalance, CrowdedDomainsAreWhereAnotherDomainWouldHelp) {
  Fleet f = machines(2, 2);  // domains 0 and 1
  uint32_t web = add_job(f, "web", 1);
  add_task(f, web, 0, 100);
  add_task(f, web, 1, 100);                                 // web: 2 tasks in domain 0
  EXPECT_EQ(crowded_domains(f), std::vector<uint32_t>{0});  // a violation (cap 1)
  f.tasks[1].machine = 2;                                   // one in each domain: fine
  EXPECT_TRUE(crowded_domains(f).empty());
  uint32_t api = add_job(f, "api", 1);
  for (int i = 0; i < 3; ++i) add_task(f, api, i < 2 ? 0 : 2, 100);  // 2 + 1 over 2 domains
  // No violation (cap 2), but a third domain would make it 1 each.
  EXPECT_EQ(score(f).spread_violations, 0);
  EXPECT_EQ(crowded_domains(f), std::vector<uint32_t>{0});
  f.jobs[api].opt_out = true;
  EXPECT_TRUE(crowded_domains(f).empty());
}

TEST(Rebalance, AnOptedOutJobStaysWhereItIs) {
  Fleet f = machines(1, 3);
  uint32_t a = add_job(f, "a", 4, false), keep = add_job(f, "keep", 4, false);
  f.jobs[keep].opt_out = true;
  add_task(f, a, 0, 3000);
  add_task(f, keep, 1, 200);
  add_task(f, a, 2, 200);
  Options o;
  for (bool exact : {false, true}) {
    std::string status;
    auto plan = exact ? plan_exact(f, o, &status) : plan_local(f, o);
    check_plan(f, plan, o);
    for (const auto& m : plan) EXPECT_NE(f.tasks[m.task].job, keep);
    Fleet after = f;
    apply_moves(after, plan);
    EXPECT_EQ(after.tasks[1].machine, 1u);
    EXPECT_EQ(score(after).machines_empty, 1u) << exact;  // machine 2 only
  }
}

// Balance: from the most used machine to the least used, until the gap is small.
TEST(Rebalance, CpuIsBalanced) {
  Fleet f = machines(1, 2);
  uint32_t j = add_job(f, "j", 10, false);
  for (int i = 0; i < 6; ++i) add_task(f, j, 0, 500);
  add_task(f, j, 1, 2100);  // not light: it is not emptied
  Options o;
  o.light = 0.1;
  auto plan = plan_local(f, o);
  check_plan(f, plan, o);
  Fleet after = f;
  apply_moves(after, plan);
  EXPECT_LT(score(after).cpu_stddev, score(f).cpu_stddev);
  for (const auto& m : plan) EXPECT_EQ(m.aim, Aim::kBalance);
}

// Random fleets: every plan of either planner keeps every rule, and the exact planner
// frees at least as many machines of its neighbourhood as the greedy one frees there.
TEST(Rebalance, RandomFleetsKeepEveryRule) {
  std::mt19937 rng(47);
  for (int round = 0; round < 30; ++round) {
    Fleet f = machines(4, 5);
    int jobs = 6;
    for (int j = 0; j < jobs; ++j) {
      add_job(f, "j" + std::to_string(j), 1 + static_cast<int>(rng() % 3), rng() % 3 != 0);
      if (rng() % 7 == 0) f.jobs.back().opt_out = true;
    }
    for (int t = 0; t < 40; ++t) {
      uint32_t m = rng() % f.machines.size();
      int64_t cpu = 100 + static_cast<int64_t>(rng() % 900);
      int64_t used = 0;
      for (const auto& task : f.tasks)
        if (task.machine == m) used += task.cpu_milli;
      if (used + cpu > f.machines[m].cpu_milli) continue;
      add_task(f, rng() % jobs, m, cpu);
    }
    if (rng() % 3 == 0) f.machines[rng() % f.machines.size()].usable = false;
    Options o;
    o.move_budget = 5 + rng() % 20;
    o.time_limit_us = 1'000'000;
    auto local = plan_local(f, o);
    check_plan(f, local, o);
    std::string status;
    auto exact = plan_exact(f, o, &status);
    check_plan(f, exact, o);
  }
}

}  // namespace
}  // namespace weft::cp::rebalance
