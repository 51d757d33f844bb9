#include "controlplane/tend/rebalance_plan.h"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

namespace weft::cp::rebalance {

const char* aim_name(Aim a) {
  switch (a) {
    case Aim::kSpread:
      return "spread over fault domains";
    case Aim::kFree:
      return "free a whole machine";
    case Aim::kBalance:
      return "balance CPU";
  }
  return "";
}

namespace {

// The fleet's books while a plan is made: what each machine holds, each job's tasks per
// domain and its fair share, and what the plan moved of each job.
class Book {
 public:
  explicit Book(const Fleet& f, double fill = 1.0) : f_(f), where_(f.tasks.size()), fill_(fill) {
    cpu_.assign(f.machines.size(), 0);
    mem_.assign(f.machines.size(), 0);
    on_.assign(f.machines.size(), {});
    std::set<uint32_t> domains;
    for (const auto& m : f.machines)
      if (m.usable) domains.insert(m.domain);
    domains_ = std::max<size_t>(domains.size(), 1);
    tasks_of_.assign(f.jobs.size(), 0);
    moved_.assign(f.jobs.size(), 0);
    for (uint32_t t = 0; t < f.tasks.size(); ++t) {
      const Task& task = f.tasks[t];
      where_[t] = task.machine;
      cpu_[task.machine] += task.cpu_milli;
      mem_[task.machine] += task.mem_mb;
      on_[task.machine].insert(t);
      ++per_domain_[{task.job, f.machines[task.machine].domain}];
      ++tasks_of_[task.job];
    }
  }
  const Fleet& fleet() const { return f_; }
  uint32_t where(uint32_t t) const { return where_[t]; }
  const std::set<uint32_t>& on(uint32_t m) const { return on_[m]; }
  double use(uint32_t m) const {
    const Machine& mc = f_.machines[m];
    return mc.cpu_milli > 0 ? static_cast<double>(cpu_[m]) / static_cast<double>(mc.cpu_milli) : 1;
  }
  int64_t cpu(uint32_t m) const { return cpu_[m]; }
  int cap(uint32_t job) const {  // a job's fair share of one domain
    int n = tasks_of_[job];
    return std::max(1, static_cast<int>((n + domains_ - 1) / domains_));
  }
  int in_domain(uint32_t job, uint32_t domain) const {
    auto it = per_domain_.find({job, domain});
    return it == per_domain_.end() ? 0 : it->second;
  }
  bool fits(uint32_t t, uint32_t m) const {
    const Task& task = f_.tasks[t];
    const Machine& mc = f_.machines[m];
    return mc.usable && where_[t] != m &&
           static_cast<double>(cpu_[m] + task.cpu_milli) <=
               fill_ * static_cast<double>(mc.cpu_milli) &&
           mem_[m] + task.mem_mb <= mc.mem_mb;
  }
  // Moving t to m makes its job's spread no worse.
  bool spread_ok(uint32_t t, uint32_t m) const {
    const Task& task = f_.tasks[t];
    const Job& j = f_.jobs[task.job];
    uint32_t from = f_.machines[where_[t]].domain, to = f_.machines[m].domain;
    if (!j.spread || from == to) return true;
    return in_domain(task.job, to) + 1 <= std::max(cap(task.job), in_domain(task.job, from) - 1);
  }
  // The job may have one more task moved in this plan.
  bool may_move(uint32_t t) const {
    const Task& task = f_.tasks[t];
    const Job& j = f_.jobs[task.job];
    return !j.opt_out && moved_[task.job] < std::max(1, j.max_unavailable) && !done_.count(t);
  }
  void move(uint32_t t, uint32_t m) {
    const Task& task = f_.tasks[t];
    uint32_t from = where_[t];
    cpu_[from] -= task.cpu_milli;
    mem_[from] -= task.mem_mb;
    on_[from].erase(t);
    --per_domain_[{task.job, f_.machines[from].domain}];
    cpu_[m] += task.cpu_milli;
    mem_[m] += task.mem_mb;
    on_[m].insert(t);
    ++per_domain_[{task.job, f_.machines[m].domain}];
    where_[t] = m;
    ++moved_[task.job];
    done_.insert(t);
  }
  void unmove(uint32_t t, uint32_t back) {  // a tentative move undone
    move(t, back);
    moved_[f_.tasks[t].job] -= 2;
    done_.erase(t);
  }

 private:
  const Fleet& f_;
  std::vector<uint32_t> where_;
  std::vector<int64_t> cpu_, mem_;
  std::vector<std::set<uint32_t>> on_;
  std::map<std::pair<uint32_t, uint32_t>, int> per_domain_;
  std::vector<int> tasks_of_, moved_;
  std::set<uint32_t> done_;  // a task moves once a plan
  size_t domains_ = 1;
  double fill_ = 1.0;  // what a move may fill a machine's CPU to
};

// The best machine for task t among those `allowed`: it fits, keeps the spread, is not
// empty (an empty machine is one the entitlement may give back) and, best fit, has the
// least CPU left once it takes t.
template <class Allowed>
int64_t best_target(const Book& b, uint32_t t, Allowed allowed) {
  const Fleet& f = b.fleet();
  int64_t best = -1;
  int64_t best_left = 0;
  for (uint32_t m = 0; m < f.machines.size(); ++m) {
    if (!allowed(m) || b.on(m).empty() || !b.fits(t, m) || !b.spread_ok(t, m)) continue;
    int64_t left = f.machines[m].cpu_milli - b.cpu(m) - f.tasks[t].cpu_milli;
    if (best < 0 || left < best_left) {
      best = m;
      best_left = left;
    }
  }
  return best;
}

}  // namespace

Score score(const Fleet& f) {
  Book b(f);
  Score s;
  for (uint32_t j = 0; j < f.jobs.size(); ++j) {
    if (!f.jobs[j].spread) continue;
    std::set<uint32_t> domains;
    for (const auto& m : f.machines) domains.insert(m.domain);
    for (uint32_t d : domains) s.spread_violations += std::max(0, b.in_domain(j, d) - b.cap(j));
  }
  std::vector<double> uses;
  for (uint32_t m = 0; m < f.machines.size(); ++m) {
    if (!f.machines[m].usable) continue;
    if (b.on(m).empty()) {
      s.machines_empty += !f.machines[m].spare;
      continue;
    }
    ++s.machines_used;
    uses.push_back(b.use(m));
  }
  if (!uses.empty()) {
    double mean = 0;
    for (double u : uses) mean += u;
    mean /= static_cast<double>(uses.size());
    double var = 0;
    for (double u : uses) var += (u - mean) * (u - mean);
    s.cpu_stddev = std::sqrt(var / static_cast<double>(uses.size()));
  }
  return s;
}

std::vector<uint32_t> crowded_domains(const Fleet& f) {
  Book b(f);
  std::set<uint32_t> domains, out;
  for (const auto& m : f.machines) domains.insert(m.domain);
  std::set<uint32_t> usable;
  for (const auto& m : f.machines)
    if (m.usable) usable.insert(m.domain);
  std::vector<int> tasks(f.jobs.size());
  for (const auto& t : f.tasks) ++tasks[t.job];
  for (uint32_t j = 0; j < f.jobs.size(); ++j) {
    if (!f.jobs[j].spread || f.jobs[j].opt_out) continue;
    int most = 0;
    for (uint32_t d : domains) most = std::max(most, b.in_domain(j, d));
    const int wider = (tasks[j] + static_cast<int>(usable.size())) /
                      (static_cast<int>(usable.size()) + 1);  // ceil(n / (D + 1))
    for (uint32_t d : domains)
      if (b.in_domain(j, d) > b.cap(j) || (wider < most && b.in_domain(j, d) == most))
        out.insert(d);
  }
  return {out.begin(), out.end()};
}

void apply_moves(Fleet& f, const std::vector<Move>& moves) {
  for (const auto& m : moves)
    if (m.task < f.tasks.size() && m.to < f.machines.size()) f.tasks[m.task].machine = m.to;
}

std::vector<Move> plan_local(const Fleet& f, const Options& o) {
  Book b(f, o.fill);
  std::vector<Move> out;
  auto take = [&](uint32_t t, uint32_t to, Aim aim) {
    out.push_back(Move{t, b.where(t), to, aim});
    b.move(t, to);
  };
  // 1. Spread: from a domain over the job's share to one under it.
  std::vector<std::vector<uint32_t>> by_job(f.jobs.size());
  for (uint32_t t = 0; t < f.tasks.size(); ++t) by_job[f.tasks[t].job].push_back(t);
  bool swapped = false;  // a swap-only spare taken (one a plan)
  for (uint32_t j = 0; j < f.jobs.size() && out.size() < o.move_budget; ++j) {
    if (!f.jobs[j].spread || f.jobs[j].opt_out) continue;
    for (uint32_t t : by_job[j]) {
      if (out.size() >= o.move_budget) break;
      uint32_t d = f.machines[b.where(t)].domain;
      if (b.in_domain(j, d) <= b.cap(j) || !b.may_move(t)) continue;
      int64_t best = -1;
      int best_count = 0;
      int64_t best_left = 0;
      for (uint32_t m = 0; m < f.machines.size(); ++m) {
        if (!b.fits(t, m)) continue;
        if (f.machines[m].swap_only && (swapped || b.on(b.where(t)).size() != 1)) continue;
        int count = b.in_domain(j, f.machines[m].domain);
        if (count + 1 > b.cap(j)) continue;
        int64_t left = f.machines[m].cpu_milli - b.cpu(m);
        // The least crowded domain first, then a machine in use, then the fullest.
        bool better =
            best < 0 || count < best_count ||
            (count == best_count && b.on(m).empty() < b.on(static_cast<uint32_t>(best)).empty()) ||
            (count == best_count && b.on(m).empty() == b.on(static_cast<uint32_t>(best)).empty() &&
             left < best_left);
        if (better) {
          best = m;
          best_count = count;
          best_left = left;
        }
      }
      if (best < 0) continue;
      swapped = swapped || f.machines[static_cast<uint32_t>(best)].swap_only;
      take(t, static_cast<uint32_t>(best), Aim::kSpread);
    }
  }
  // 2. Whole machines: the lightest first, each emptied only if all its tasks find room
  // on machines that stay.
  std::vector<uint32_t> light;
  for (uint32_t m = 0; m < f.machines.size(); ++m)
    if (f.machines[m].usable && !b.on(m).empty() && b.use(m) < o.light) light.push_back(m);
  std::sort(light.begin(), light.end(),
            [&](uint32_t x, uint32_t y) { return b.cpu(x) < b.cpu(y); });
  if (o.max_candidates && light.size() > o.max_candidates) light.resize(o.max_candidates);
  std::set<uint32_t> emptied;
  for (uint32_t m : light) {
    if (out.size() + b.on(m).size() > o.move_budget) continue;
    std::vector<uint32_t> tasks(b.on(m).begin(), b.on(m).end());
    std::sort(tasks.begin(), tasks.end(),
              [&](uint32_t x, uint32_t y) { return f.tasks[x].cpu_milli > f.tasks[y].cpu_milli; });
    std::vector<std::pair<uint32_t, uint32_t>> tried;  // (task, target)
    bool all = true;
    for (uint32_t t : tasks) {
      int64_t to = b.may_move(t)
                       ? best_target(b, t, [&](uint32_t c) { return c != m && !emptied.count(c); })
                       : -1;
      if (to < 0) {
        all = false;
        break;
      }
      tried.emplace_back(t, static_cast<uint32_t>(to));
      b.move(t, static_cast<uint32_t>(to));
    }
    if (!all) {
      for (auto it = tried.rbegin(); it != tried.rend(); ++it) b.unmove(it->first, m);
      continue;
    }
    for (const auto& [t, to] : tried) out.push_back(Move{t, m, to, Aim::kFree});
    emptied.insert(m);
  }
  // 3. Balance: the most used machine's smallest task that narrows the gap, to the least
  // used machine in use.
  while (out.size() < o.move_budget) {
    int64_t hot = -1, cold = -1;
    for (uint32_t m = 0; m < f.machines.size(); ++m) {
      if (!f.machines[m].usable || b.on(m).empty()) continue;
      if (hot < 0 || b.use(m) > b.use(static_cast<uint32_t>(hot))) hot = m;
      if (cold < 0 || b.use(m) < b.use(static_cast<uint32_t>(cold))) cold = m;
    }
    if (hot < 0 || hot == cold) break;
    uint32_t h = static_cast<uint32_t>(hot), c = static_cast<uint32_t>(cold);
    double gap = b.use(h) - b.use(c);
    if (gap < o.balance_gap) break;
    int64_t pick = -1;
    for (uint32_t t : b.on(h)) {
      if (!b.may_move(t) || !b.fits(t, c) || !b.spread_ok(t, c)) continue;
      double dt = static_cast<double>(f.tasks[t].cpu_milli);
      double after = std::abs((b.cpu(h) - dt) / f.machines[h].cpu_milli -
                              (b.cpu(c) + dt) / f.machines[c].cpu_milli);
      if (after >= gap) continue;
      if (pick < 0 || f.tasks[t].cpu_milli < f.tasks[static_cast<uint32_t>(pick)].cpu_milli)
        pick = t;
    }
    if (pick < 0) break;
    take(static_cast<uint32_t>(pick), c, Aim::kBalance);
  }
  return out;
}

namespace {

// The exact planner's integer program over a neighbourhood of the fleet (GLPK): binary
// columns x[t][m] (task t on target m) and y[m] (candidate m kept), and the rows that
// hold a plan to the planner's rules. Built by parts, then solved once.
class ExactModel {
 public:
  ExactModel(const Fleet& f, const Options& o, const Book& b)
      : f_(f), o_(o), b_(b), lp_(glp_create_prob()) {
    glp_set_obj_dir(lp_, GLP_MIN);
  }
  ~ExactModel() { glp_delete_prob(lp_); }
  ExactModel(const ExactModel&) = delete;
  ExactModel& operator=(const ExactModel&) = delete;

  // The neighbourhood: the lightest machines in use (their tasks may move, each machine
  // may be emptied) and, as targets, those and the fullest machines in use with room.
  // False when no machine is light enough to empty.
  bool choose_neighbourhood() {
    std::vector<uint32_t> used;
    for (uint32_t m = 0; m < f_.machines.size(); ++m)
      if (f_.machines[m].usable && !b_.on(m).empty()) used.push_back(m);
    std::sort(used.begin(), used.end(),
              [&](uint32_t x, uint32_t y) { return b_.use(x) < b_.use(y); });
    for (uint32_t m : used)
      if (cand_.size() < o_.neighbourhood && b_.use(m) < o_.light) cand_.push_back(m);
    if (cand_.empty()) return false;
    cand_set_.insert(cand_.begin(), cand_.end());
    targets_ = cand_;
    for (auto it = used.rbegin(); it != used.rend() && targets_.size() < cand_.size() * 5; ++it)
      if (!cand_set_.count(*it) && b_.use(*it) < o_.fill) targets_.push_back(*it);
    for (uint32_t m : cand_)
      for (uint32_t t : b_.on(m)) tasks_.push_back(t);
    return true;
  }

  // Columns: x[t][m] for targets m that could hold t alone, then y[m] for candidates.
  void add_columns() {
    for (uint32_t t : tasks_) {
      const Task& task = f_.tasks[t];
      bool pinned = f_.jobs[task.job].opt_out;
      for (uint32_t m : targets_) {
        bool home = task.machine == m;
        if (pinned && !home) continue;
        int64_t fixed_cpu = b_.cpu(m);
        if (!home && !cand_set_.count(m) &&
            static_cast<double>(fixed_cpu + task.cpu_milli) > o_.fill * f_.machines[m].cpu_milli)
          continue;
        x_[{t, m}] = add_col(home ? 0.0 : 1.0);  // a move costs one
      }
    }
    for (uint32_t m : cand_)
      y_[m] = add_col(1000.0);  // a machine kept costs more than any plan's moves
  }

  // Each task somewhere.
  void placement_rows() {
    for (uint32_t t : tasks_) {
      Terms terms;
      for (uint32_t m : targets_)
        if (auto it = x_.find({t, m}); it != x_.end()) terms.emplace_back(it->second, 1.0);
      row(GLP_FX, 1, 1, terms);
    }
  }

  // Capacity: what stays of other tasks plus what the plan puts there; a candidate holds
  // anything only if kept (y).
  void capacity_rows() {
    std::map<uint32_t, int64_t> stay_cpu, stay_mem;
    for (uint32_t m : targets_)
      for (uint32_t t : b_.on(m))
        if (!cand_set_.count(m)) {
          stay_cpu[m] += f_.tasks[t].cpu_milli;
          stay_mem[m] += f_.tasks[t].mem_mb;
        }
    for (uint32_t m : targets_) {
      Terms cpu_terms, mem_terms;
      for (uint32_t t : tasks_)
        if (auto it = x_.find({t, m}); it != x_.end()) {
          cpu_terms.emplace_back(it->second, static_cast<double>(f_.tasks[t].cpu_milli));
          mem_terms.emplace_back(it->second, static_cast<double>(f_.tasks[t].mem_mb));
        }
      // A machine's own tasks may stay on it however full it is; what comes is held to `fill`.
      double cpu_room = std::max(o_.fill * static_cast<double>(f_.machines[m].cpu_milli),
                                 static_cast<double>(b_.cpu(m))) -
                        static_cast<double>(stay_cpu[m]);
      double mem_room = static_cast<double>(f_.machines[m].mem_mb - stay_mem[m]);
      if (cand_set_.count(m)) {
        cpu_terms.emplace_back(y_[m], -cpu_room);
        mem_terms.emplace_back(y_[m], -mem_room);
        row(GLP_UP, 0, 0, cpu_terms);
        row(GLP_UP, 0, 0, mem_terms);
        for (uint32_t t : tasks_)  // x <= y (a task of no CPU still keeps its machine)
          if (auto it = x_.find({t, m}); it != x_.end())
            row(GLP_UP, 0, 0, {{it->second, 1}, {y_[m], -1}});
      } else {
        row(GLP_UP, 0, cpu_room, cpu_terms);
        row(GLP_UP, 0, mem_room, mem_terms);
      }
    }
  }

  // Spread: no job's domain beyond its share (or beyond what it has now, if it is).
  void spread_rows() {
    std::map<std::pair<uint32_t, uint32_t>, Terms> spread;
    std::map<std::pair<uint32_t, uint32_t>, int> moving_now;
    for (uint32_t t : tasks_) {
      uint32_t j = f_.tasks[t].job;
      if (!f_.jobs[j].spread) continue;
      ++moving_now[{j, f_.machines[f_.tasks[t].machine].domain}];
      for (uint32_t m : targets_)
        if (auto it = x_.find({t, m}); it != x_.end())
          spread[{j, f_.machines[m].domain}].emplace_back(it->second, 1.0);
    }
    for (const auto& [key, terms] : spread) {
      auto [j, d] = key;
      int fixed = b_.in_domain(j, d) - moving_now[key];
      double limit = std::max(b_.cap(j) - fixed, moving_now[key]);
      row(GLP_UP, 0, limit, terms);
    }
  }

  // At most max_unavailable of a job and move_budget in all: counted as tasks not home.
  void budget_rows() {
    std::map<uint32_t, Terms> home_of_job;
    Terms all_home;
    std::map<uint32_t, int> n_of_job;
    for (uint32_t t : tasks_) {
      auto it = x_.find({t, f_.tasks[t].machine});
      uint32_t j = f_.tasks[t].job;
      ++n_of_job[j];
      if (it == x_.end()) continue;
      home_of_job[j].emplace_back(it->second, 1.0);
      all_home.emplace_back(it->second, 1.0);
    }
    for (const auto& [j, n] : n_of_job)
      row(GLP_LO, n - std::max(1, f_.jobs[j].max_unavailable), 0, home_of_job[j]);
    row(GLP_LO, static_cast<double>(tasks_.size()) - static_cast<double>(o_.move_budget), 0,
        all_home);
  }

  // Solves within the time limit; the moves of the plan found (`status` says how good).
  std::vector<Move> solve(std::string* status) {
    auto say = [&](const std::string& s) {
      if (status) *status = s;
    };
    glp_load_matrix(lp_, static_cast<int>(ia_.size()) - 1, ia_.data(), ja_.data(), ar_.data());
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = static_cast<int>(std::min<uint64_t>(o_.time_limit_us / 1000, 3'600'000));
    int rc = glp_intopt(lp_, &parm);
    int st = glp_mip_status(lp_);
    if (st != GLP_OPT && st != GLP_FEAS) {
      say(rc == GLP_ETMLIM                       ? "time limit, no plan found"
          : rc == GLP_ENOPFS || st == GLP_NOFEAS ? "no feasible plan"
                                                 : "GLPK failed (" + std::to_string(rc) + ")");
      return {};
    }
    say(st == GLP_OPT ? "optimal" : "feasible (time limit)");
    std::vector<Move> out;
    std::set<uint32_t> emptied;
    for (uint32_t m : cand_)
      if (glp_mip_col_val(lp_, y_[m]) < 0.5) emptied.insert(m);
    for (uint32_t t : tasks_)
      for (uint32_t m : targets_)
        if (auto it = x_.find({t, m});
            it != x_.end() && m != f_.tasks[t].machine && glp_mip_col_val(lp_, it->second) > 0.5)
          out.push_back(Move{t, f_.tasks[t].machine, m,
                             emptied.count(f_.tasks[t].machine) ? Aim::kFree : Aim::kBalance});
    return out;
  }

 private:
  using Terms = std::vector<std::pair<int, double>>;
  int add_col(double cost) {
    int c = glp_add_cols(lp_, 1);
    glp_set_col_kind(lp_, c, GLP_BV);
    glp_set_obj_coef(lp_, c, cost);
    return c;
  }
  void row(int type, double lo, double hi, const Terms& terms) {
    int r = glp_add_rows(lp_, 1);
    glp_set_row_bnds(lp_, r, type, lo, hi);
    for (const auto& [c, v] : terms) {
      ia_.push_back(r);
      ja_.push_back(c);
      ar_.push_back(v);
    }
  }

  const Fleet& f_;
  const Options& o_;
  const Book& b_;
  glp_prob* lp_;
  std::vector<uint32_t> cand_, targets_, tasks_;
  std::set<uint32_t> cand_set_;
  std::map<std::pair<uint32_t, uint32_t>, int> x_;
  std::map<uint32_t, int> y_;
  std::vector<int> ia_{0}, ja_{0};  // the matrix, from index 1 as GLPK reads it
  std::vector<double> ar_{0};
};

}  // namespace

std::vector<Move> plan_exact(const Fleet& f, const Options& o, std::string* status) {
  Book b(f);
  ExactModel model(f, o, b);
  if (!model.choose_neighbourhood()) {
    if (status) *status = "no improvement";
    return {};
  }
  model.add_columns();
  model.placement_rows();
  model.capacity_rows();
  model.spread_rows();
  model.budget_rows();
  return model.solve(status);
}

}  // namespace weft::cp::rebalance
