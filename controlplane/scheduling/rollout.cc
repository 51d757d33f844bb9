// The scheduler's rollouts (scheduler.h, docs/jobs.md "Rollouts"): a job's revisions,
// pausing and resuming its rolling updates, and the canary phase with its promotion.
#include <algorithm>
#include <climits>

#include "common/rpc/protocol.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

void Scheduler::add_revision(Job& j, uint64_t now) {
  auto& revs = j.progress.revisions;
  revs.push_back(
      Revision{j.generation, weft::to_json(static_cast<const weft::JobSpec&>(j.spec)), now, ""});
  if (revs.size() > kRevisionsKept)
    revs.erase(revs.begin(),
               revs.begin() + static_cast<std::ptrdiff_t>(revs.size() - kRevisionsKept));
  bool canaries = j.generation > 1 && j.spec.canary > 0 && !j.spec.is_batch() && !j.spec.periodic;
  j.progress.canary = canaries;
  j.canaries_ready_since_us = 0;
  if (canaries)
    job_event(j.spec.name, "canaries",
              std::to_string(std::min(j.spec.canary, j.spec.count)) + " tasks of generation " +
                  std::to_string(j.generation) + " first; the rest after a promotion");
  changed_jobs_.insert(j.spec.name);
}

void Scheduler::note_revision(const std::string& job, const std::string& note) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.progress.revisions.empty()) return;
  it->second.progress.revisions.back().note = note.substr(0, 256);
  changed_jobs_.insert(job);
}

int Scheduler::update_restarts_allowed(const Job& j) const {
  if (j.progress.paused) return 0;
  if (!j.progress.canary) return INT_MAX;
  int current = 0, stopping_old = 0;
  if (auto jt = job_tasks_.find(j.spec.name); jt != job_tasks_.end())
    for (const auto& [key, t] : jt->second) {
      if (t->generation == j.generation &&
          (task_live(t->state) || t->state == TaskState::kDraining))
        ++current;
      else if (t->generation < j.generation && t->state == TaskState::kStopping)
        ++stopping_old;  // its index starts again with the new spec
    }
  return std::max(0, std::min(j.spec.canary, j.spec.count) - current - stopping_old);
}

Result<std::vector<Command>> Scheduler::pause_rollout(const std::string& job, bool paused,
                                                      uint64_t now) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + job).with_code(rpc::kNotFound);
  if (job_fenced(job)) return moving_error();
  Job& j = it->second;
  if (j.spec.is_batch()) return field_error("name", "a batch job has no rollouts");
  if (j.progress.paused == paused) return std::vector<Command>{};
  j.progress.paused = paused;
  changed_jobs_.insert(job);
  job_event(job, paused ? "rollout paused" : "rollout resumed", "");
  if (paused) return std::vector<Command>{};
  return roll(j, now);
}

Result<std::vector<Command>> Scheduler::promote(const std::string& job, uint64_t now,
                                                const std::string& why) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + job).with_code(rpc::kNotFound);
  if (job_fenced(job)) return moving_error();
  Job& j = it->second;
  if (!j.progress.canary)
    return field_error("name", "job " + job + " has no canaries waiting for a promotion")
        .with_code(rpc::kConflict);
  j.progress.canary = false;
  j.canaries_ready_since_us = 0;
  changed_jobs_.insert(job);
  job_event(job, "promoted", why);
  return roll(j, now);
}

void Scheduler::auto_promote(uint64_t now, std::vector<Command>* out) {
  for (auto& entry : jobs_) {  // (a lambda below uses the job: no structured binding)
    const std::string& name = entry.first;
    Job& j = entry.second;
    if (!j.progress.canary || !j.spec.auto_promote_us || j.stopping || j.progress.paused ||
        fenced(j.spec.entitlement_id))
      continue;
    int ready = 0;
    for_job(name, [&](TaskRecord& t) { ready += t.generation == j.generation && available(t); });
    if (ready < std::min(j.spec.canary, j.spec.count)) {
      j.canaries_ready_since_us = 0;
      continue;
    }
    if (!j.canaries_ready_since_us) {
      j.canaries_ready_since_us = now;
      continue;
    }
    if (now - j.canaries_ready_since_us < j.spec.auto_promote_us) continue;
    auto more = promote(name, now,
                        "automatically: its canaries were ready for " +
                            std::to_string(j.spec.auto_promote_us / 1'000'000) + " s");
    if (more.ok()) out->insert(out->end(), more->begin(), more->end());
  }
}

}  // namespace weft::cp
