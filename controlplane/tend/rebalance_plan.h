// The ReBalancer's planner (Twine's ReBalancer: the allocator places fast and simply,
// and this improves its decisions afterwards, asynchronously): given one entitlement's
// machines and tasks, the task moves that improve, in this order,
//
//  1. spread: a job's tasks in one fault domain beyond its fair share (ceil(tasks /
//     domains)), after failures and growth, moved to domains under it;
//  2. whole machines freed: lightly used machines emptied onto the others, so that the
//     entitlement returns them to the free pool (another entitlement's, or a profile
//     change's);
//  3. CPU balance: tasks moved from the most used machines to the least used.
//
// Every move keeps the task's machine within its capacity, makes no job's spread worse,
// moves at most `max_unavailable` tasks of a job in one plan (a plan's moves run at once,
// each make-before-break through TaskControl `move`), no task of a job that opted out,
// and at most `move_budget` tasks in all.
//
// Two planners of the same problem: a local search (greedy, fast: all three aims), and
// an exact one for consolidation (2) over a bounded neighbourhood, an integer program
// solved by GLPK (Debian's libglpk) within a time limit. bench/rebalance compares them.
// Pure: the control plane gives it a snapshot and carries the moves out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::cp::rebalance {

struct Machine {
  std::string name;
  uint32_t domain = 0;  // fault domain (rack / MSB)
  int64_t cpu_milli = 0, mem_mb = 0;
  bool usable = true;  // healthy, not drained: takes tasks (an unusable one keeps its own)
  // In the free pool, and the entitlement has room for it under its quota: a task may
  // move there to restore its job's spread (the machine then joins the entitlement); no
  // other aim uses an empty machine.
  bool spare = false;
  // A spare the entitlement has no room for under its quota: only a task alone on its
  // machine may move there (that machine empties and goes back: a swap), one a plan.
  bool swap_only = false;
};
struct Job {
  std::string name;
  int max_unavailable = 1;
  bool spread = true;    // placement "spread" (a "pack" job has no spread to keep)
  bool opt_out = false;  // never moved by the ReBalancer
};
struct Task {
  std::string id;
  uint32_t job = 0;      // index into Fleet::jobs
  uint32_t machine = 0;  // index into Fleet::machines
  int64_t cpu_milli = 0, mem_mb = 0;
};
struct Fleet {
  std::vector<Machine> machines;
  std::vector<Job> jobs;
  std::vector<Task> tasks;
};

enum class Aim { kSpread, kFree, kBalance };
const char* aim_name(Aim a);

struct Move {
  uint32_t task = 0;
  uint32_t from = 0, to = 0;
  Aim aim = Aim::kSpread;
};

struct Options {
  size_t move_budget = 100;  // moves in one plan, all aims
  double light = 0.5;        // a machine below this CPU use (of its capacity) may be emptied
  double balance_gap = 0.2;  // balance until the most and least used differ by less
  uint64_t time_limit_us = 2'000'000;  // the exact planner's (GLPK's) limit
  size_t neighbourhood = 16;           // the exact planner: the lightest machines it may empty
  size_t max_candidates = 0;           // the local search's (0: every light machine)
  double fill = 0.85;  // no move fills a machine's CPU beyond this (headroom for load)
};

struct Score {
  int64_t spread_violations = 0;  // tasks beyond their job's fair share of a domain, summed
  size_t machines_used = 0;       // usable machines with a task
  size_t machines_empty = 0;      // usable machines without, not spare (returnable)
  double cpu_stddev = 0;          // of CPU use (fraction of capacity) over machines used
};
Score score(const Fleet& f);
// The fault domains a machine of another domain would help a spread job leave: where it
// has more than its fair share of tasks, or its most crowded domains when one more
// domain would lower that share (ceil(tasks / (domains + 1)) below its most in one).
std::vector<uint32_t> crowded_domains(const Fleet& f);
// The fleet after the moves.
void apply_moves(Fleet& f, const std::vector<Move>& moves);

std::vector<Move> plan_local(const Fleet& f, const Options& o);
// Consolidation only, exactly over the neighbourhood; `status` says how GLPK ended
// ("optimal", "feasible (time limit)", "no improvement", or why it failed).
std::vector<Move> plan_exact(const Fleet& f, const Options& o, std::string* status);

}  // namespace weft::cp::rebalance
