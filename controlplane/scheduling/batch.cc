#include "controlplane/scheduling/batch.h"

#include <algorithm>

#include "common/rpc/protocol.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

using json = nlohmann::json;

json progress_json(const JobProgress& p, const std::function<int64_t(uint64_t)>& time_of) {
  json j = json::object();
  if (p.succeeded) j["succeeded"] = p.succeeded;
  if (p.failed) j["failed"] = p.failed;
  if (!p.outcome.empty()) j["outcome"] = p.outcome;
  if (!p.reason.empty()) j["reason"] = p.reason;
  if (p.started_us) j["started"] = time_of(p.started_us);
  if (p.ended_us) j["ended"] = time_of(p.ended_us);
  if (p.last_period) j["last_period"] = p.last_period;
  if (!p.parent.empty()) j["parent"] = p.parent;
  if (p.paused) j["paused"] = true;
  if (p.canary) j["canary"] = true;
  if (!p.revisions.empty()) {
    json revs = json::array();
    for (const auto& r : p.revisions)
      revs.push_back({{"generation", r.generation},
                      {"spec", r.spec},
                      {"at", time_of(r.at_us)},
                      {"note", r.note}});
    j["revisions"] = std::move(revs);
  }
  return j;
}

JobProgress progress_from_json(const json& j, const std::function<uint64_t(int64_t)>& mono_of) {
  JobProgress p;
  if (!j.is_object()) return p;
  auto count = [&](const char* k) {
    const json& v = j.contains(k) ? j[k] : json();
    return v.is_number_integer() && v.get<int64_t>() >= 0 &&
                   v.get<int64_t>() <= kMaxTasksPerJob * 1000LL
               ? static_cast<int>(v.get<int64_t>())
               : 0;
  };
  auto text = [&](const char* k) {
    const json& v = j.contains(k) ? j[k] : json();
    return v.is_string() && v.get_ref<const std::string&>().size() <= 1024 ? v.get<std::string>()
                                                                           : std::string();
  };
  auto number = [&](const char* k) -> std::optional<int64_t> {
    const json& v = j.contains(k) ? j[k] : json();
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
      return std::nullopt;
    return v.get<int64_t>();
  };
  p.succeeded = count("succeeded");
  p.failed = count("failed");
  p.outcome = text("outcome");
  if (p.outcome != "succeeded" && p.outcome != "failed") p.outcome.clear();
  p.reason = text("reason");
  if (auto t = number("started")) p.started_us = mono_of(*t);
  if (auto t = number("ended")) p.ended_us = mono_of(*t);
  if (auto t = number("last_period"); t && *t > 0) p.last_period = *t;
  p.parent = text("parent");
  if (!weft::valid_job_name(p.parent)) p.parent.clear();
  auto flag = [&](const char* k) { return j.contains(k) && j[k].is_boolean() && j[k].get<bool>(); };
  p.paused = flag("paused");
  p.canary = flag("canary");
  if (j.contains("revisions") && j["revisions"].is_array())
    for (const auto& r : j["revisions"]) {
      if (!r.is_object() || p.revisions.size() >= kRevisionsKept) continue;
      Revision rev;
      const json& g = r.contains("generation") ? r["generation"] : json();
      if (!g.is_number_unsigned() || g.get<uint64_t>() == 0) continue;
      rev.generation = g.get<uint64_t>();
      if (!r.contains("spec") || !r["spec"].is_object()) continue;
      rev.spec = r["spec"];
      if (r.contains("at") && r["at"].is_number_integer() && r["at"].get<int64_t>() > 0)
        rev.at_us = mono_of(r["at"].get<int64_t>());
      if (r.contains("note") && r["note"].is_string() &&
          r["note"].get_ref<const std::string&>().size() <= 256)
        rev.note = r["note"].get<std::string>();
      p.revisions.push_back(std::move(rev));
    }
  return p;
}

std::optional<JobProgress> BatchRuns::progress(const std::string& job) const {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end()) return std::nullopt;
  return it->second.progress;
}

void BatchRuns::task_ended(JobRecord& j, const TaskRecord& t, bool succeeded) {
  if (j.ended() || j.stopping) return;
  s_.changed_jobs_.insert(j.spec.name);
  if (succeeded) {
    ++j.progress.succeeded;
    return;
  }
  ++j.progress.failed;
  j.progress.reason = "task " + t.id + " on " + s_.alloc_.spec(t.machine).name + ": " +
                      (t.message.empty() ? std::string("failed") : t.message);
}

void BatchRuns::check(JobRecord& j, uint64_t now, std::vector<Command>* out) {
  if (j.ended() || j.spec.periodic) return;
  const BatchSpec& b = j.spec.batch;
  if (j.progress.succeeded >= b.completions) {
    end(j, "succeeded",
        std::to_string(j.progress.succeeded) + " completions, " +
            std::to_string(j.progress.failed) + " failures",
        now, out);
    return;
  }
  if (j.progress.failed > b.max_failures) {
    end(j, "failed",
        std::to_string(j.progress.failed) + " failures, more than max_failures (" +
            std::to_string(b.max_failures) + "); the last: " + j.progress.reason,
        now, out);
    return;
  }
  // A task held (its spec refused, or it failed the same way before its program ran
  // again and again) is not retried: the job cannot complete.
  std::string held;
  s_.table_.for_job(j.spec.name, [&](TaskRecord& t) {
    if (held.empty() && refused(t, j)) held = "task " + t.id + " cannot start: " + t.message;
  });
  if (!held.empty()) end(j, "failed", held, now, out);
}

void BatchRuns::end(JobRecord& j, const char* outcome, const std::string& reason, uint64_t now,
                    std::vector<Command>* out) {
  j.progress.outcome = outcome;
  j.progress.reason = reason;
  j.progress.ended_us = now;
  s_.changed_jobs_.insert(j.spec.name);
  s_.table_.job_event(j.spec.name, outcome, reason);
  const std::string& name = j.spec.name;
  s_.table_.for_job(name, [&](TaskRecord& t) {
    if (!running_copy(t.state)) return;
    t.since_us = now;
    if (t.state == TaskState::kPending) {
      s_.table_.set_state(t, TaskState::kStopped);
      return;
    }
    s_.table_.set_state(t, TaskState::kStopping);
    out->push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
  });
  s_.replacement_.unwait_if([&](const std::string& id) {
    auto t = s_.table_.find(id);
    return t == s_.table_.end() || t->second.job == name;
  });
}

std::map<std::string, std::vector<std::string>> BatchRuns::periodic_jobs() const {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, j] : s_.jobs_)
    if (j.spec.periodic && !j.stopping && !s_.handover_.fenced(j.spec.entitlement_id)) out[name];
  if (out.empty()) return out;
  for (const auto& [name, j] : s_.jobs_)
    if (!j.progress.parent.empty() && !j.ended() && !j.stopping)
      if (auto it = out.find(j.progress.parent); it != out.end()) it->second.push_back(name);
  return out;
}

std::vector<std::string> BatchRuns::ended_runs(const std::string& job) const {
  std::vector<std::pair<uint64_t, std::string>> runs;
  for (const auto& [name, j] : s_.jobs_)
    if (j.progress.parent == job && j.ended() && !j.stopping)
      runs.emplace_back(j.progress.ended_us, name);
  std::sort(runs.begin(), runs.end());
  std::vector<std::string> out;
  for (auto& r : runs) out.push_back(std::move(r.second));
  return out;
}

Result<std::vector<Command>> BatchRuns::start_period(const std::string& job, int64_t period,
                                                     uint64_t now) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || !it->second.spec.periodic || it->second.stopping)
    return field_error("job", "no periodic job " + job).with_code(rpc::kNotFound);
  if (period <= it->second.progress.last_period)
    return field_error("period",
                       "period " + std::to_string(period) + " of " + job + " has run already");
  JobSpec run = it->second.spec;
  run.name = weft::period_run_name(job, period);
  run.periodic.reset();
  if (s_.jobs_.count(run.name)) {  // (a stale entry: the period is done)
    it->second.progress.last_period = period;
    s_.changed_jobs_.insert(job);
    return std::vector<Command>{};
  }
  TRY_ASSIGN(auto cmds, s_.create(run, now));
  JobRecord& created = s_.jobs_.at(run.name);
  created.progress.parent = job;
  JobRecord& parent = s_.jobs_.at(job);
  parent.progress.last_period = period;
  s_.changed_jobs_.insert(job);
  s_.table_.job_event(job, "run started", run.name);
  return cmds;
}

void BatchRuns::skip_period(const std::string& job, int64_t period, const std::string& why) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || !it->second.spec.periodic ||
      period <= it->second.progress.last_period)
    return;
  it->second.progress.last_period = period;
  s_.changed_jobs_.insert(job);
  if (!why.empty()) s_.table_.job_event(job, "period skipped", why);
}

void BatchRuns::tick(uint64_t now, std::vector<Command>* out) {
  for (auto& [name, j] : s_.jobs_) {
    if (!j.spec.is_batch() || j.ended() || j.stopping || j.spec.periodic ||
        s_.handover_.fenced(j.spec.entitlement_id))
      continue;
    if (j.spec.batch.deadline_us && now > j.progress.started_us &&
        now - j.progress.started_us > j.spec.batch.deadline_us) {
      end(j, "failed",
          "its deadline (" + std::to_string(j.spec.batch.deadline_us / 1'000'000) +
              " s) passed with " + std::to_string(j.progress.succeeded) + " of " +
              std::to_string(j.spec.batch.completions) + " completions",
          now, out);
      auto more = s_.after_stopped(name, now);
      out->insert(out->end(), more.begin(), more.end());
    } else if (idle_.erase(name)) {
      auto more = s_.placer_.converge(j, now);
      if (more.ok()) out->insert(out->end(), more->begin(), more->end());
    }
  }
  idle_.clear();
}

}  // namespace weft::cp
