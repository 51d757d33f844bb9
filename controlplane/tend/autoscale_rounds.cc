#include "controlplane/tend/autoscale_rounds.h"

#include <cmath>
#include <type_traits>

#include "common/clock.h"
#include "common/log.h"
#include "common/task_usage.h"

namespace weft::cp {

using json = nlohmann::json;

AutoscaleRounds::AutoscaleRounds(EventLoop& loop, const Scheduler& sched, AgentAsks& asks,
                                 Options opts, Hooks hooks, Notes& notes)
    : loop_(loop),
      sched_(sched),
      asks_(asks),
      opts_(opts),
      hooks_(std::move(hooks)),
      notes_(notes) {}

void AutoscaleRounds::restore(std::map<std::string, json> notes) {
  restored_ = std::move(notes);
  // At once, so that job.autoscale shows them before the first round here.
  const std::string prefix = kNotePrefix;
  std::vector<std::string> jobs;
  for (const auto& [key, note] : restored_)
    if (key.compare(0, prefix.size(), prefix) == 0) jobs.push_back(key.substr(prefix.size()));
  for (const auto& name : jobs) {
    auto spec = sched_.job(name);
    if (!spec || !spec->autoscale) continue;
    JobState& st = jobs_[name];
    st.scaler = std::make_unique<Autoscaler>(policy_of(*spec));
    st.spec = *spec->autoscale;
    resume(name, st, settings_of(*spec->autoscale));
  }
}

json AutoscaleRounds::settings_of(AutoscaleSpec a) {
  a.paused = false;  // a pause is not a new setting: the history goes on
  return to_json(a);
}

void AutoscaleRounds::resume(const std::string& job, JobState& st, const json& settings) {
  auto recent = restored_.extract(kNotePrefix + job);
  auto history = restored_.extract(kHistoryPrefix + job);
  if (recent.empty()) return;
  const json& r = recent.mapped();
  if (!r.is_object() || r.value("settings", json()) != settings) return;  // a new history
  st.scaler->restore(r.value("scaler", json()), history.empty() ? json() : history.mapped());
  st.history_saved = st.scaler->newest_slot();
  auto number = [&r](const char* name, auto fallback) {
    auto it = r.find(name);
    using T = decltype(fallback);
    if (it == r.end() || !it->is_number()) return fallback;
    if constexpr (std::is_floating_point_v<T>) return it->get<T>();
    return it->is_number_integer() ? it->get<T>() : fallback;
  };
  st.total = number("total", 0.0);
  st.measured = number("measured", int64_t{0});
  st.measured_at_us = number("measured_at_us", uint64_t{0});
  if (auto d = r.find("decision"); d != r.end() && d->is_object() &&
                                   d->value("desired", json()).is_number_integer() &&
                                   d->value("proportional", json()).is_number_integer()) {
    AutoscaleDecision dec;
    dec.desired = (*d)["desired"].get<int64_t>();
    dec.proportional = (*d)["proportional"].get<int64_t>();
    if (auto why = d->find("reason"); why != d->end() && why->is_string())
      dec.reason = why->get<std::string>();
    if (auto p = d->find("predicted"); p != d->end() && p->is_number_integer())
      dec.predicted = p->get<int64_t>();
    st.last = dec;
  }
  if (auto c = r.find("changes"); c != r.end() && c->is_array())
    for (const auto& v : *c)
      if (v.is_object() && st.changes.size() < kChangesKept) st.changes.push_back(v);
  log_info("autoscaling goes on with the last leader's history",
           {{"JOB", job}, {"SLOTS", std::to_string(st.scaler->slots_kept())}});
}

void AutoscaleRounds::save(const std::string& job, JobState& st) {
  if (!st.scaler) return;
  json decision;
  if (st.last) {
    decision = {{"desired", st.last->desired},
                {"proportional", st.last->proportional},
                {"reason", st.last->reason}};
    if (st.last->predicted) decision["predicted"] = *st.last->predicted;
  }
  json note{{"settings", settings_of(st.spec)},
            {"scaler", st.scaler->recent_json()},
            {"total", st.total},
            {"measured", st.measured},
            {"measured_at_us", st.measured_at_us},
            {"decision", decision},
            {"changes", json(st.changes)}};
  std::string text = note.dump();
  if (text != st.saved) {
    notes_.put(kNotePrefix + job, std::move(note));
    st.saved = std::move(text);
  }
  if (st.scaler->slots_kept() && st.scaler->newest_slot() != st.history_saved) {
    notes_.put(kHistoryPrefix + job, st.scaler->history_json());
    st.history_saved = st.scaler->newest_slot();
  }
}

void AutoscaleRounds::forget(const std::string& job) {
  notes_.erase(kNotePrefix + job);
  notes_.erase(kHistoryPrefix + job);
}

void AutoscaleRounds::start() {
  auto t = loop_.add_timer_in(opts_.interval_us, [this] {
    timer_.reset();
    round();
    start();
  });
  if (t.ok()) timer_ = std::move(t).value();
}

void AutoscaleRounds::stop() {
  timer_.reset();
  ++round_id_;  // answers still to come are ignored
  asking_ = false;
}

AutoscalePolicy AutoscaleRounds::policy_of(const JobSpec& spec) const {
  const AutoscaleSpec& a = *spec.autoscale;
  AutoscalePolicy p;
  p.min = a.min;
  p.max = a.max;
  // The target per task in the figures' units: cores, MiB, or the app metric's own.
  double reserved =
      a.metric == AutoscaleMetric::kCpu      ? static_cast<double>(spec.per_task.cpu_milli) / 1000.0
      : a.metric == AutoscaleMetric::kMemory ? static_cast<double>(spec.per_task.mem_mb)
                                             : 1.0;
  p.target = a.target * reserved;
  p.tolerance = a.tolerance;
  p.down_window_us = a.down_window_us;
  p.predictive = a.predictive;
  return p;
}

void AutoscaleRounds::round() {
  // The last round still waits for answers (a loaded fleet, or an interval shorter than
  // the timeout): it ends at its deadline; cutting it short would decide on nothing.
  if (asking_) return;
  uint64_t id = ++round_id_;
  sums_.clear();
  job_of_.clear();
  std::map<MachineId, UsageRequest> asks;
  std::map<std::string, JobState> kept;
  for (const auto& name : sched_.autoscaled_jobs()) {
    auto spec = sched_.job(name);
    if (!spec || !spec->autoscale) continue;
    JobState& st = kept[name];
    if (auto it = jobs_.find(name); it != jobs_.end()) st = std::move(it->second);
    // New settings (other than the pause) start a new history.
    AutoscaleSpec unpaused = *spec->autoscale;
    unpaused.paused = st.spec.paused;
    if (!st.scaler || !(unpaused == st.spec)) {
      const bool first = !st.scaler;
      st.scaler = std::make_unique<Autoscaler>(policy_of(*spec));
      st.saved.clear();
      if (first) resume(name, st, settings_of(*spec->autoscale));
    }
    st.spec = *spec->autoscale;
    st.ready = 0;
    const AutoscaleSpec& a = *spec->autoscale;
    for (const TaskRecord* t : sched_.tasks().refs_of(name)) {
      if (!available(*t)) continue;
      ++st.ready;
      job_of_[t->id] = name;
      UsageRequest& req = asks[t->machine];
      req.tasks.push_back(t->id);
      if (a.metric != AutoscaleMetric::kApp) continue;
      // The job's tasks on this machine are one group of the machine's request.
      if (req.scrape.empty() || req.scrape.back().tasks.empty() ||
          job_of_[req.scrape.back().tasks.front()] != name) {
        if (req.scrape.size() >= kMaxScrapeGroups) continue;  // 64 app-metric jobs a machine
        req.scrape.push_back(ScrapeGroup{{}, a.app.port, a.app.path, a.app.name});
      }
      req.scrape.back().tasks.push_back(t->id);
    }
  }
  // Jobs that stopped autoscaling (or are gone) are forgotten, their notes with them.
  for (const auto& [name, st] : jobs_)
    if (!kept.count(name)) forget(name);
  jobs_ = std::move(kept);
  // What the last leader kept of jobs that no longer autoscale: the first round here took
  // up the rest.
  for (const auto& [key, note] : restored_) notes_.erase(key);
  restored_.clear();
  asking_ = true;
  asks_.usage(std::move(asks), opts_.timeout_us, [this, id](AgentAsks::Answer a) {
    if (id != round_id_) return;  // stopped meanwhile
    for (const auto& [task, u] : a.tasks) {
      auto j = job_of_.find(task);
      if (j == job_of_.end()) continue;
      auto st = jobs_.find(j->second);
      if (st == jobs_.end()) continue;
      AutoscaleMetric metric = st->second.spec.metric;
      if (metric == AutoscaleMetric::kApp && !u.metric) continue;  // its scrape failed
      double figure = metric == AutoscaleMetric::kCpu ? static_cast<double>(u.cpu_milli) / 1000.0
                      : metric == AutoscaleMetric::kMemory
                          ? static_cast<double>(u.mem_bytes) / (1 << 20)
                          : *u.metric;
      auto& [load, n] = sums_[j->second];
      load += figure;
      ++n;
    }
    finish(id);
  });
}

void AutoscaleRounds::finish(uint64_t round_id) {
  if (round_id != round_id_) return;
  asking_ = false;
  uint64_t now = now_realtime_us();
  for (auto& [name, st] : jobs_) {
    auto spec = sched_.job(name);
    if (!spec || !spec->autoscale) continue;
    decide(name, st, now);
    save(name, st);
  }
}

void AutoscaleRounds::decide(const std::string& job, JobState& st, uint64_t now_us) {
  auto sum = sums_.find(job);
  int64_t measured = sum == sums_.end() ? 0 : sum->second.second;
  // A scale-down waiting for the job's TaskController counts as made.
  int64_t current = sched_.target_count(job);
  bool in_bounds = current >= st.spec.min && current <= st.spec.max;
  if (measured > 0) {
    // The tasks not measured (their machine did not answer in time) are taken at the
    // measured ones' mean.
    double total =
        sum->second.first * static_cast<double>(st.ready) / static_cast<double>(measured);
    st.total = total;
    st.measured = measured;
    st.measured_at_us = now_us;
    st.scaler->observe(now_us, total, st.ready);
  } else if (in_bounds) {
    return;  // nothing measured this round: no decision (a stale figure is not a load)
  }
  AutoscaleDecision d = st.scaler->decide(now_us, current, st.spec.max);
  st.last = d;
  // Paused now, not only when the round began: a pause that came while the agents were
  // being asked holds this round's decision too.
  auto now_spec = sched_.job(job);
  const bool paused =
      st.spec.paused || !now_spec || !now_spec->autoscale || now_spec->autoscale->paused;
  if (d.desired == current || paused) return;
  std::string reason = d.reason;
  Status done = hooks_.scale(job, static_cast<int>(d.desired));
  int64_t reached = done.ok() ? d.desired : current;
  if (!done.ok() && d.desired > current) {
    // The quota (or the machines) leaves less room: the largest size that fits.
    int64_t lo = current, hi = d.desired - 1;
    while (lo < hi) {
      int64_t mid = lo + (hi - lo + 1) / 2;
      if (hooks_.scale(job, static_cast<int>(mid)).ok())
        lo = mid;
      else
        hi = mid - 1;
    }
    if (lo > current) {
      reached = lo;
      reason += "; " + std::to_string(lo) + " is what fits (" + done.error().message + ")";
      done = Status();
    }
  }
  if (reached != current) st.scaler->changed(now_us, current, reached);
  // A refusal is recorded once, not every round while it lasts.
  std::pair<int64_t, int64_t> refused{current, d.desired};
  if (!done.ok() && st.refused == refused) return;
  st.refused = done.ok() ? std::pair<int64_t, int64_t>{} : refused;
  if (hooks_.decided) hooks_.decided(job, current, done.ok() ? reached : d.desired, reason, done);
  st.changes.push_back(json{{"at_us", now_us},
                            {"from", current},
                            {"to", done.ok() ? reached : d.desired},
                            {"reason", reason},
                            {"result", done.ok() ? "ok" : done.error().str()}});
  while (st.changes.size() > kChangesKept) st.changes.pop_front();
}

std::optional<json> AutoscaleRounds::show(const std::string& job) const {
  auto spec = sched_.job(job);
  if (!spec || !spec->autoscale) return std::nullopt;
  const AutoscaleSpec& a = *spec->autoscale;
  json out{{"job", job},
           {"count", spec->count},
           {"paused", a.paused},
           {"settings", to_json(a)},
           {"target_per_task", policy_of(*spec).target},
           {"unit", a.metric == AutoscaleMetric::kCpu      ? "cores"
                    : a.metric == AutoscaleMetric::kMemory ? "MiB"
                                                           : a.app.name}};
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.measured_at_us == 0) {
    out["measured"] = nullptr;
  } else {
    const JobState& st = it->second;
    out["measured"] = json{{"at_us", st.measured_at_us},
                           {"load", st.total},
                           {"ready", st.ready},
                           {"tasks_measured", st.measured},
                           {"load_per_task", st.ready ? st.total / st.ready : 0.0}};
  }
  if (it != jobs_.end() && it->second.last) {
    const AutoscaleDecision& d = *it->second.last;
    json decision{{"desired", d.desired}, {"proportional", d.proportional}, {"reason", d.reason}};
    if (d.predicted) decision["predicted"] = *d.predicted;
    out["decision"] = decision;
  } else {
    out["decision"] = nullptr;
  }
  json changes = json::array();
  if (it != jobs_.end())
    for (const auto& c : it->second.changes) changes.push_back(c);
  out["changes"] = changes;
  return out;
}

}  // namespace weft::cp
