#include "controlplane/scheduling/rollout.h"

#include <algorithm>
#include <climits>

#include "common/rpc/protocol.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

Result<std::vector<Command>> Rollouts::update(const JobSpec& spec, uint64_t now) {
  auto it = s_.jobs_.find(spec.name);
  if (it == s_.jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + spec.name).with_code(rpc::kNotFound);
  if (s_.handover_.job_fenced(spec.name)) return moving_error();
  JobRecord& j = it->second;
  if (j.spec.periodic || spec.periodic) {
    // A periodic job's spec is its next runs' (the runs under way keep theirs).
    if (!j.spec.periodic || !spec.periodic)
      return field_error("periodic", "a job becomes periodic, or stops being so, as a new job");
    if (spec.entitlement_id != j.spec.entitlement_id)
      return field_error("entitlement", "a job moves to another entitlement as a new job");
    j.spec = spec;
    ++j.generation;
    add_revision(j, now);
    s_.changed_jobs_.insert(j.spec.name);
    return std::vector<Command>{};
  }
  if (j.spec.is_batch() || spec.is_batch())
    return field_error("kind", "a batch job is not updated: stop it and create another");
  bool autoscaled = spec.autoscale || j.spec.autoscale;  // its count is autoscaling's
  if (!(spec.per_task == j.spec.per_task) || spec.machine_type != j.spec.machine_type ||
      spec.entitlement_id != j.spec.entitlement_id || (spec.count != j.spec.count && !autoscaled) ||
      spec.placement != j.spec.placement || spec.ports != j.spec.ports)
    return field_error("resources",
                       "an update changes the task spec, max_unavailable and discovery_drain; "
                       "resources, ports, machine type, entitlement, placement and count are "
                       "changed by scale or a new job");
  if (spec.max_unavailable < 1) return field_error("max_unavailable", "must be at least 1");
  std::string old_image = j.spec.task.is_object() ? j.spec.task.value("image", "") : "";
  nlohmann::json old_package =
      j.spec.task.is_object() ? j.spec.task.value("package", nlohmann::json()) : nlohmann::json();
  j.spec.task = spec.task;
  j.spec.max_unavailable = spec.max_unavailable;
  j.spec.controller = spec.controller;
  j.spec.discovery_drain_us = spec.discovery_drain_us;
  j.spec.autoscale = spec.autoscale;
  j.spec.rebalance = spec.rebalance;
  j.spec.canary = spec.canary;
  j.spec.auto_promote_us = spec.auto_promote_us;
  ++j.generation;
  add_revision(j, now);
  j.rolling = true;
  s_.changed_jobs_.insert(j.spec.name);
  // A new image or package: every machine of the job fetches it first, so that
  // replacing a task there costs a restart, not a download.
  std::string new_image = j.spec.task.is_object() ? j.spec.task.value("image", "") : "";
  nlohmann::json new_package =
      j.spec.task.is_object() ? j.spec.task.value("package", nlohmann::json()) : nlohmann::json();
  nlohmann::json fetch = nlohmann::json::object();
  if (!new_image.empty() && new_image != old_image) fetch["image"] = new_image;
  if (new_package.is_object() && new_package != old_package) fetch["package"] = new_package;
  std::vector<Command> prefetch;
  j.prefetching.clear();
  if (!fetch.empty()) {
    s_.table_.for_job(j.spec.name, [&](TaskRecord& t) {
      if (task_live(t.state) && t.state != TaskState::kPending) j.prefetching.insert(t.machine);
    });
    j.prefetch_deadline_us = now + kPrefetchTimeoutUs;
    for (MachineId m : j.prefetching)
      prefetch.push_back(Command{Command::Kind::kPrefetch, m, j.spec.name,
                                 nlohmann::json{{"fetch", fetch}, {"generation", j.generation}}});
  }
  // Indices with nothing live (their start was refused, say) get the new spec at once;
  // the others roll, max_unavailable at a time.
  TRY_ASSIGN(auto out, s_.placer_.converge(j, now));
  auto rolled = roll(j, now);
  out.insert(out.end(), rolled.begin(), rolled.end());
  out.insert(out.begin(), prefetch.begin(), prefetch.end());
  return out;
}

std::vector<Command> Rollouts::prefetched(const std::string& job, uint64_t generation, MachineId m,
                                          uint64_t now) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || it->second.stopping || it->second.generation != generation ||
      s_.handover_.job_fenced(job) || !it->second.prefetching.erase(m))
    return {};
  return roll(it->second, now);
}

std::vector<Command> Rollouts::roll(JobRecord& j, uint64_t now) {
  std::vector<Command> out;
  if (j.spec.is_batch()) return out;  // batch jobs are not updated
  // Unavailable, whatever the reason (Twine §2.4): every index of the job with no task
  // running now: stopping for this update, starting, pending, lost, failed or draining.
  std::set<int> running_idx;
  std::vector<TaskRecord*> old;
  s_.table_.for_job(j.spec.name, [&](TaskRecord& t) {
    if (available(t)) running_idx.insert(t.index);
    if ((t.generation < j.generation || j.restarts.count(t.id)) && task_live(t.state))
      old.push_back(&t);
  });
  j.rolling = !old.empty();
  if (old.empty() && j.progress.canary) {  // every task has the new spec: nothing to hold
    j.progress.canary = false;
    s_.changed_jobs_.insert(j.spec.name);
  }
  // An update's restarts (not an operator's restart of one task) as the rollout allows:
  // none while paused, the canaries in a canary phase.
  int allowed = restarts_allowed(j);
  auto may_restart = [&](const TaskRecord* t) {
    if (j.restarts.count(t->id) && t->generation == j.generation) return true;
    return allowed > 0;
  };
  if (j.controlled()) {
    // The controller decides which restarts go, and weft bounds how many: never more
    // than max_unavailable of the job's indices down for weft's own operations at once,
    // whatever was acknowledged (a controller that acknowledges everything, or one that
    // is not the job's, cannot take the whole job down). An acknowledgement beyond the
    // bound waits for a restart in progress to run again.
    int ours = 0;
    for (const auto& [index, op] : j.in_progress) ours += running_idx.count(index) ? 0 : 1;
    std::sort(old.begin(), old.end(),
              [](const TaskRecord* a, const TaskRecord* b) { return a->index < b->index; });
    for (TaskRecord* t : old) {
      std::string op = "restart/" + t->id;
      if (!j.granted.count(op)) continue;
      if (ours >= j.spec.max_unavailable) break;
      if (!may_restart(t)) continue;
      if (!(j.restarts.count(t->id) && t->generation == j.generation)) --allowed;
      j.granted.erase(op);
      j.restarts.erase(t->id);
      ++ours;
      s_.table_.set_state(*t, TaskState::kStopping);
      t->since_us = now;
      out.push_back(Command{Command::Kind::kStop, t->machine, t->id, {}});
      j.in_progress[t->index] = op;
    }
    return out;
  }
  int in_flight = 0;
  for (int i = 0; i < j.spec.count; ++i) in_flight += running_idx.count(i) ? 0 : 1;
  std::sort(old.begin(), old.end(),
            [](const TaskRecord* a, const TaskRecord* b) { return a->index < b->index; });
  if (!j.prefetching.empty() && now >= j.prefetch_deadline_us) j.prefetching.clear();
  for (TaskRecord* t : old) {
    if (in_flight >= j.spec.max_unavailable) break;
    if (j.prefetching.count(t->machine)) continue;  // its machine is fetching the image
    if (!may_restart(t)) continue;
    if (!(j.restarts.count(t->id) && t->generation == j.generation)) --allowed;
    j.restarts.erase(t->id);
    s_.table_.set_state(*t, TaskState::kStopping);
    t->since_us = now;
    out.push_back(Command{Command::Kind::kStop, t->machine, t->id, {}});
    ++in_flight;
  }
  return out;
}

void Rollouts::add_revision(JobRecord& j, uint64_t now) {
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
    s_.table_.job_event(j.spec.name, "canaries",
                        std::to_string(std::min(j.spec.canary, j.spec.count)) +
                            " tasks of generation " + std::to_string(j.generation) +
                            " first; the rest after a promotion");
  s_.changed_jobs_.insert(j.spec.name);
}

void Rollouts::note_revision(const std::string& job, const std::string& note) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || it->second.progress.revisions.empty()) return;
  it->second.progress.revisions.back().note = note.substr(0, 256);
  s_.changed_jobs_.insert(job);
}

int Rollouts::restarts_allowed(const JobRecord& j) const {
  if (j.progress.paused) return 0;
  if (!j.progress.canary) return INT_MAX;
  int current = 0, stopping_old = 0;
  if (auto jt = s_.table_.by_job().find(j.spec.name); jt != s_.table_.by_job().end())
    for (const auto& [key, t] : jt->second) {
      if (t->generation == j.generation &&
          (task_live(t->state) || t->state == TaskState::kDraining))
        ++current;
      else if (t->generation < j.generation && t->state == TaskState::kStopping)
        ++stopping_old;  // its index starts again with the new spec
    }
  return std::max(0, std::min(j.spec.canary, j.spec.count) - current - stopping_old);
}

Result<std::vector<Command>> Rollouts::pause_rollout(const std::string& job, bool paused,
                                                     uint64_t now) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + job).with_code(rpc::kNotFound);
  if (s_.handover_.job_fenced(job)) return moving_error();
  JobRecord& j = it->second;
  if (j.spec.is_batch()) return field_error("name", "a batch job has no rollouts");
  if (j.progress.paused == paused) return std::vector<Command>{};
  j.progress.paused = paused;
  s_.changed_jobs_.insert(job);
  s_.table_.job_event(job, paused ? "rollout paused" : "rollout resumed", "");
  if (paused) return std::vector<Command>{};
  return roll(j, now);
}

Result<std::vector<Command>> Rollouts::promote(const std::string& job, uint64_t now,
                                               const std::string& why) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + job).with_code(rpc::kNotFound);
  if (s_.handover_.job_fenced(job)) return moving_error();
  JobRecord& j = it->second;
  if (!j.progress.canary)
    return field_error("name", "job " + job + " has no canaries waiting for a promotion")
        .with_code(rpc::kConflict);
  j.progress.canary = false;
  j.canaries_ready_since_us = 0;
  s_.changed_jobs_.insert(job);
  s_.table_.job_event(job, "promoted", why);
  return roll(j, now);
}

void Rollouts::auto_promote(uint64_t now, std::vector<Command>* out) {
  for (auto& entry : s_.jobs_) {  // (a lambda below uses the job: no structured binding)
    const std::string& name = entry.first;
    JobRecord& j = entry.second;
    if (!j.progress.canary || !j.spec.auto_promote_us || j.stopping || j.progress.paused ||
        s_.handover_.fenced(j.spec.entitlement_id))
      continue;
    int ready = 0;
    s_.table_.for_job(
        name, [&](TaskRecord& t) { ready += t.generation == j.generation && available(t); });
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

void Rollouts::roll_unfetched(uint64_t now, std::vector<Command>* out) {
  for (auto& [name, j] : s_.jobs_) {
    if (j.prefetching.empty() || now < j.prefetch_deadline_us || j.stopping ||
        s_.handover_.fenced(j.spec.entitlement_id))
      continue;
    auto rolled = roll(j, now);
    out->insert(out->end(), rolled.begin(), rolled.end());
  }
}

}  // namespace weft::cp
