#include "controlplane/tend/rebalancer.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <map>

#include "common/clock.h"
#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;

RebalanceSnapshot rebalance_snapshot(const Allocator& alloc, const Scheduler& sched,
                                     EntitlementId e, const std::string& dc) {
  RebalanceSnapshot s;
  std::map<MachineId, uint32_t> index;
  std::map<std::string, uint32_t> domains;
  for (MachineId m = 0; m < alloc.machine_count(); ++m) {
    if (alloc.entitlement_of(m) != e) continue;
    const MachineSpec& spec = alloc.spec(m);
    uint32_t d = domains.emplace(spec.domain, static_cast<uint32_t>(domains.size())).first->second;
    if (d == s.domains.size()) s.domains.push_back(spec.domain);
    index[m] = static_cast<uint32_t>(s.fleet.machines.size());
    s.machine_ids.push_back(m);
    s.fleet.machines.push_back(rebalance::Machine{spec.name, d, spec.capacity.cpu_milli,
                                                  spec.capacity.mem_mb, alloc.usable(m)});
  }
  {
    // Without room under the quota, spares for swaps only (rebalance.h).
    const size_t room = alloc.room(e);
    std::map<std::string, size_t> spares;
    for (MachineId m = 0; m < alloc.machine_count(); ++m) {
      const MachineSpec& spec = alloc.spec(m);
      if (alloc.entitlement_of(m) != kFreePool || !alloc.usable(m) || alloc.tasks_on(m) > 0 ||
          (!dc.empty() && spec.dc != dc) ||
          spares[spec.domain] >= std::min(std::max<size_t>(room, 1), kSparePerDomain))
        continue;
      ++spares[spec.domain];
      uint32_t d =
          domains.emplace(spec.domain, static_cast<uint32_t>(domains.size())).first->second;
      if (d == s.domains.size()) s.domains.push_back(spec.domain);
      index[m] = static_cast<uint32_t>(s.fleet.machines.size());
      s.machine_ids.push_back(m);
      s.fleet.machines.push_back(rebalance::Machine{spec.name, d, spec.capacity.cpu_milli,
                                                    spec.capacity.mem_mb, true, true, room == 0});
    }
  }
  std::vector<int64_t> listed_cpu(s.fleet.machines.size()), listed_mem(s.fleet.machines.size());
  for (const auto& pj : sched.handover().persisted_jobs()) {
    const JobSpec& spec = pj.spec;
    if (spec.entitlement_id != e || pj.stopping) continue;
    uint32_t j = static_cast<uint32_t>(s.fleet.jobs.size());
    // A job with a task that is not ready (starting, failed, moving) is left alone: its
    // moves wait until every index is available again.
    int ready = 0;
    const auto tasks = sched.tasks().refs_of(spec.name);
    for (const TaskRecord* t : tasks) ready += available(*t) && t->index < spec.count;
    s.fleet.jobs.push_back(rebalance::Job{spec.name, spec.max_unavailable,
                                          spec.placement == weft::PlacementPolicy::kSpread,
                                          !spec.rebalance || ready < spec.count});
    for (const TaskRecord* t : tasks) {
      if (!available(*t) || t->state != TaskState::kRunning) continue;
      auto it = index.find(t->machine);
      if (it == index.end()) continue;
      s.fleet.tasks.push_back(
          rebalance::Task{t->id, j, it->second, spec.per_task.cpu_milli, spec.per_task.mem_mb});
      listed_cpu[it->second] += spec.per_task.cpu_milli;
      listed_mem[it->second] += spec.per_task.mem_mb;
    }
  }
  // What the snapshot's tasks do not account for (tasks starting, stopping, draining)
  // stays held: the machine's capacity for the plan is less by that.
  for (size_t i = 0; i < s.fleet.machines.size(); ++i) {
    MachineId m = s.machine_ids[i];
    const MachineSpec& spec = alloc.spec(m);
    Resources free = alloc.free(m);
    int64_t other_cpu = spec.capacity.cpu_milli - free.cpu_milli - listed_cpu[i];
    int64_t other_mem = spec.capacity.mem_mb - free.mem_mb - listed_mem[i];
    s.fleet.machines[i].cpu_milli -= std::max<int64_t>(other_cpu, 0);
    s.fleet.machines[i].mem_mb -= std::max<int64_t>(other_mem, 0);
  }
  return s;
}

namespace {
json score_json(const rebalance::Score& s) {
  return json{{"spread_violations", s.spread_violations},
              {"machines_used", s.machines_used},
              {"machines_empty", s.machines_empty},
              {"cpu_stddev", s.cpu_stddev}};
}
}  // namespace

json rebalance_plan_json(const RebalanceSnapshot& s, const rebalance::Options& o, bool exact) {
  auto t0 = std::chrono::steady_clock::now();
  std::string status;
  auto plan =
      exact ? rebalance::plan_exact(s.fleet, o, &status) : rebalance::plan_local(s.fleet, o);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  rebalance::Fleet after = s.fleet;
  rebalance::apply_moves(after, plan);
  json moves = json::array();
  for (const auto& m : plan) {
    const auto& t = s.fleet.tasks[m.task];
    moves.push_back({{"task", t.id},
                     {"job", s.fleet.jobs[t.job].name},
                     {"from", s.fleet.machines[m.from].name},
                     {"to", s.fleet.machines[m.to].name},
                     {"aim", rebalance::aim_name(m.aim)}});
  }
  json out{{"planner", exact ? "exact" : "local"},
           {"machines", s.fleet.machines.size()},
           {"jobs", s.fleet.jobs.size()},
           {"tasks", s.fleet.tasks.size()},
           {"before", score_json(rebalance::score(s.fleet))},
           {"after", score_json(rebalance::score(after))},
           {"moves", moves},
           {"planning_ms", ms}};
  if (exact) out["solver"] = status;
  return out;
}

Status join_spare(Allocator& alloc, const Scheduler& sched, const std::string& task, MachineId to,
                  bool* joined) {
  *joined = false;
  if (to >= alloc.machine_count() || alloc.entitlement_of(to) != kFreePool) return {};
  auto t = sched.tasks().find(task);
  if (t == sched.tasks().end()) return field_error("task", "no such task: " + task);
  const EntitlementId e = t->second.entitlement;
  const MachineId from = t->second.machine;
  if (alloc.room(e) == 0 && (alloc.tasks_on(from) != 1 || alloc.pinned(from)))
    return make_error(
        "the entitlement's quota is full (a swap needs the task alone on an "
        "unpinned machine)");
  TRY(alloc.assign(to, e));
  *joined = true;
  return {};
}

Rebalancer::Rebalancer(EventLoop& loop, const Allocator& alloc, Scheduler& sched, Options opts,
                       Hooks hooks, Notes* notes)
    : loop_(loop),
      alloc_(alloc),
      sched_(sched),
      opts_(opts),
      hooks_(std::move(hooks)),
      notes_(notes) {}

json Rebalancer::event_json(const Event& ev) {
  return json{{"at_us", ev.at_us}, {"job", ev.job}, {"task", ev.task},    {"from", ev.from},
              {"to", ev.to},       {"aim", ev.aim}, {"result", ev.result}};
}

std::optional<Rebalancer::Event> Rebalancer::event_from(const json& j) {
  if (!j.is_object()) return std::nullopt;
  Event ev;
  auto at = j.find("at_us");
  if (at == j.end() || !at->is_number_unsigned()) return std::nullopt;
  ev.at_us = at->get<uint64_t>();
  for (auto [name, out] :
       {std::pair{"job", &ev.job}, std::pair{"task", &ev.task}, std::pair{"from", &ev.from},
        std::pair{"to", &ev.to}, std::pair{"aim", &ev.aim}, std::pair{"result", &ev.result}}) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string()) return std::nullopt;
    *out = it->get<std::string>();
  }
  return ev;
}

// Monotonic times go out as the wall-clock times they stand for, and come back as this
// process's monotonic times of the same age (a wall clock stepped meanwhile moves them
// by the step: a budget spent a little early or late, never a move lost).
void Rebalancer::save(EntitlementId id, const State& st, uint64_t now) {
  if (!notes_) return;
  const uint64_t wall = now_realtime_us();
  auto wall_of = [&](uint64_t mono) { return wall - std::min(wall, now - std::min(now, mono)); };
  json made = json::array(), moving = json::array(), recent = json::array();
  for (uint64_t t : st.made) made.push_back(wall_of(t));
  for (const auto& [task, at] : st.moving) {
    auto ev = st.moving_event.find(task);
    moving.push_back({{"task", task},
                      {"at_us", wall_of(at)},
                      {"event", ev == st.moving_event.end() ? json() : event_json(ev->second)}});
  }
  for (const auto& ev : st.recent) recent.push_back(event_json(ev));
  notes_->put(kNotePrefix + std::to_string(id), json{{"made", made},
                                                     {"moving", moving},
                                                     {"recent", recent},
                                                     {"last_plan", st.last_plan},
                                                     {"dc", st.dc},
                                                     {"crowded", st.crowded},
                                                     {"last_round_us", st.last_round_us},
                                                     {"outcome", st.outcome}});
}

void Rebalancer::restore(const std::map<std::string, json>& notes, uint64_t mono_now,
                         uint64_t wall_now) {
  const std::string prefix = kNotePrefix;
  auto mono_of = [&](uint64_t wall) {
    uint64_t age = wall_now > wall ? wall_now - wall : 0;
    return mono_now > age ? mono_now - age : 0;
  };
  for (const auto& note : notes) {
    const std::string& key = note.first;
    const json& j = note.second;  // (a structured binding cannot be captured: clang 14)
    const std::string id = key.substr(std::min(key.size(), prefix.size()));
    char* end = nullptr;
    const unsigned long n = std::strtoul(id.c_str(), &end, 10);
    State st;
    bool ok = !id.empty() && end && *end == '\0' && n > 0 && n <= UINT32_MAX && j.is_object();
    auto list = [&](const char* name) -> const json& {
      static const json kNone = json::array();
      auto it = ok ? j.find(name) : j.end();
      if (ok && (it == j.end() || !it->is_array())) ok = false;
      return ok ? *it : kNone;
    };
    for (const auto& t : list("made")) {
      if (!t.is_number_unsigned()) ok = false;
      if (ok) st.made.push_back(mono_of(t.get<uint64_t>()));
    }
    std::sort(st.made.begin(), st.made.end());
    for (const auto& m : list("moving")) {
      auto ev = m.is_object() ? event_from(m.value("event", json())) : std::nullopt;
      if (!ev || !m.value("task", json()).is_string() ||
          !m.value("at_us", json()).is_number_unsigned()) {
        ok = false;
        continue;
      }
      std::string task = m["task"].get<std::string>();
      st.moving[task] = mono_of(m["at_us"].get<uint64_t>());
      st.moving_event[task] = *ev;
    }
    for (const auto& e : list("recent")) {
      auto ev = event_from(e);
      if (!ev) ok = false;
      if (ok && st.recent.size() < kRecent) st.recent.push_back(*ev);
    }
    for (const auto& d : list("crowded"))
      if (d.is_string()) st.crowded.insert(d.get<std::string>());
    if (ok) {
      st.last_plan = j.value("last_plan", json());
      if (auto dc = j.find("dc"); dc != j.end() && dc->is_string()) st.dc = dc->get<std::string>();
      if (auto o = j.find("outcome"); o != j.end() && o->is_string())
        st.outcome = o->get<std::string>();
      if (auto r = j.find("last_round_us"); r != j.end() && r->is_number_unsigned())
        st.last_round_us = r->get<uint64_t>();
    }
    if (!ok) {
      log_warn("a ReBalancer note is not readable: dropped", {{"KEY", key}});
      if (notes_) notes_->erase(key);
      continue;
    }
    states_[static_cast<EntitlementId>(n)] = std::move(st);
  }
}

void Rebalancer::start() {
  auto t = loop_.add_timer_in(opts_.interval_us, [this] {
    timer_.reset();
    round();
    start();
  });
  if (t.ok()) timer_ = std::move(t).value();
}

void Rebalancer::stop() {
  timer_.reset();
}

void Rebalancer::round_at(uint64_t now) {
  std::map<EntitlementId, State> kept;
  for (const auto& e : hooks_.entitlements()) {
    State& st = kept[e.id];
    if (auto it = states_.find(e.id); it != states_.end()) st = std::move(it->second);
    tend(e, st, now);
    save(e.id, st, now);
  }
  // Entitlements gone (or moved away, or fenced for a move: taken up again after) are
  // forgotten, their notes with them.
  if (notes_)
    for (const auto& [id, st] : states_)
      if (!kept.count(id)) notes_->erase(kNotePrefix + std::to_string(id));
  states_ = std::move(kept);
}

void Rebalancer::record(State& st, Event e) {
  st.recent.push_back(std::move(e));
  while (st.recent.size() > kRecent) st.recent.pop_front();
}

void Rebalancer::tend(const Entitlement& e, State& st, uint64_t now) {
  st.last_round_us = now_realtime_us();
  // The last plan's moves: done once the task stopped beside its ready copy (or ended);
  // withdrawn when its controller has not acknowledged in time.
  for (auto it = st.moving.begin(); it != st.moving.end();) {
    const std::string& task = it->first;
    Event ev = st.moving_event[task];
    ev.at_us = now_realtime_us();
    if (!sched_.moves().moving(task)) {
      ev.result = "done";
    } else if (now - it->second > opts_.move_timeout_us && sched_.moves().withdraw_move(task)) {
      ev.result = "withdrawn: its job's TaskController did not acknowledge it in time";
    } else {
      ++it;
      continue;
    }
    record(st, std::move(ev));
    st.moving_event.erase(task);
    it = st.moving.erase(it);
  }
  while (!st.made.empty() && now - st.made.front() >= 3600'000'000ull) st.made.pop_front();
  if (e.paused) {
    st.outcome = "paused";
    st.crowded.clear();  // nothing borrowed for it either
    return;
  }
  if (!st.moving.empty()) {
    st.outcome = "waiting for " + std::to_string(st.moving.size()) + " moves under way";
    return;
  }
  const int64_t left = opts_.moves_per_hour - static_cast<int64_t>(st.made.size());
  const int64_t budget = std::min(opts_.moves_per_round, left);
  if (budget <= 0) {
    st.outcome = "the hourly move budget is spent";
    return;
  }
  RebalanceSnapshot snap = rebalance_snapshot(alloc_, sched_, e.id, e.dc);
  rebalance::Options o;
  o.move_budget = static_cast<size_t>(budget);
  auto plan = rebalance::plan_local(snap.fleet, o);
  rebalance::Fleet after = snap.fleet;
  rebalance::apply_moves(after, plan);
  const rebalance::Score after_score = rebalance::score(after);
  st.last_plan = nlohmann::json{{"before", score_json(rebalance::score(snap.fleet))},
                                {"after", score_json(after_score)},
                                {"planned", plan.size()}};
  st.dc = e.dc;
  st.crowded.clear();
  for (uint32_t d : rebalance::crowded_domains(after)) st.crowded.insert(snap.domains.at(d));
  size_t made = 0, refused = 0;
  for (const auto& m : plan) {
    const auto& t = snap.fleet.tasks[m.task];
    Event ev{now_realtime_us(),
             snap.fleet.jobs[t.job].name,
             t.id,
             snap.fleet.machines[m.from].name,
             snap.fleet.machines[m.to].name,
             rebalance::aim_name(m.aim),
             "moving"};
    std::string reason = "rebalance: " + ev.aim + " (" + ev.from + " -> " + ev.to + ")";
    Status s = hooks_.move(t.id, snap.machine_ids[m.to], reason);
    if (!s.ok()) {
      ++refused;
      ev.result = "refused: " + s.error().str();
      record(st, std::move(ev));
      continue;
    }
    ++made;
    st.made.push_back(now);
    st.moving[t.id] = now;
    st.moving_event[t.id] = ev;
    hooks_.moved(e.name, ev);
    record(st, std::move(ev));
  }
  st.outcome = plan.empty() ? "nothing to improve"
                            : std::to_string(made) + " moves made" +
                                  (refused ? ", " + std::to_string(refused) + " refused" : "");
}

std::map<std::string, std::set<std::string>> Rebalancer::wanted() const {
  std::map<std::string, std::set<std::string>> out;
  for (const auto& [id, st] : states_)
    if (!st.crowded.empty() && st.moving.empty())
      out[st.dc].insert(st.crowded.begin(), st.crowded.end());
  return out;
}

nlohmann::json Rebalancer::status(const Entitlement& e) const {
  json out{{"entitlement", e.name},
           {"paused", e.paused},
           {"interval_s", opts_.interval_us / 1'000'000},
           {"moves_per_round", opts_.moves_per_round},
           {"moves_per_hour", opts_.moves_per_hour},
           {"moves_last_hour", 0},
           {"moving", json::array()},
           {"recent", json::array()}};
  auto it = states_.find(e.id);
  if (it == states_.end()) {
    out["outcome"] = "no round yet";
    return out;
  }
  const State& st = it->second;
  const uint64_t now = now_monotonic_us();
  out["moves_last_hour"] = std::count_if(st.made.begin(), st.made.end(),
                                         [&](uint64_t t) { return now - t < 3600'000'000ull; });
  for (const auto& [task, ev] : st.moving_event) out["moving"].push_back(event_json(ev));
  for (const auto& ev : st.recent) out["recent"].push_back(event_json(ev));
  out["outcome"] = st.outcome;
  out["last_round_us"] = st.last_round_us;
  if (!st.last_plan.is_null()) out["last_plan"] = st.last_plan;
  return out;
}

}  // namespace weft::cp
