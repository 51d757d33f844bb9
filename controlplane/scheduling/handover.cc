#include "controlplane/scheduling/handover.h"

#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

void Handover::restore_task(const TaskRecord& t) {
  auto j = s_.jobs_.find(t.job);
  s_.table_.put(t, j == s_.jobs_.end() ? 0 : j->second.spec.entitlement_id);
}

std::optional<PersistedJob> Handover::persisted_job(const std::string& name) const {
  auto it = s_.jobs_.find(name);
  if (it == s_.jobs_.end()) return std::nullopt;
  return PersistedJob{it->second.spec, it->second.generation, it->second.stopping,
                      it->second.progress};
}

std::vector<PersistedJob> Handover::persisted_jobs() const {
  std::vector<PersistedJob> out;
  for (const auto& [name, j] : s_.jobs_)
    out.push_back({j.spec, j.generation, j.stopping, j.progress});
  return out;
}

void Handover::restore_job(const PersistedJob& p) {
  JobRecord j;
  j.spec = p.spec;
  j.generation = p.generation;
  j.stopping = p.stopping;
  j.rolling = true;
  j.progress = p.progress;
  if (j.spec.is_batch() && !j.spec.periodic && !j.ended()) s_.batch_.idle_.insert(j.spec.name);
  s_.jobs_[p.spec.name] = std::move(j);
}

std::optional<MovedJob> Handover::moved_job(const std::string& name) const {
  auto it = s_.jobs_.find(name);
  if (it == s_.jobs_.end()) return std::nullopt;
  const JobRecord& j = it->second;
  return MovedJob{{j.spec, j.generation, j.stopping, j.progress},
                  j.granted,
                  j.moves,
                  j.in_progress,
                  j.fallback};
}

void Handover::adopt_job(const MovedJob& m, const std::vector<TaskRecord>& tasks) {
  const std::string& name = m.job.spec.name;
  forget_job(name);  // taken in again (a move resumed): what it was here goes
  restore_job(m.job);
  JobRecord& j = s_.jobs_.at(name);
  j.granted = m.granted;
  j.moves = m.moves;
  j.in_progress = m.in_progress;
  j.fallback = m.fallback;
  s_.changed_jobs_.insert(name);
  for (const auto& t : tasks) s_.table_.put(t, j.spec.entitlement_id);
  s_.replacement_.queue_waits(&name);
}

void Handover::forget_job(const std::string& name) {
  auto it = s_.jobs_.find(name);
  if (it == s_.jobs_.end()) return;
  for (const auto& t : s_.table_.of_job(name)) s_.table_.erase(t.id);
  s_.replacement_.unwait_if([&](const std::string& id) { return !s_.table_.count(id); });
  s_.jobs_.erase(it);
  s_.changed_jobs_.insert(name);
  s_.alloc_.release(name);
}

void Handover::finish_restore() {
  s_.replacement_.waiting_.clear();
  s_.replacement_.waiting_set_.clear();
  s_.replacement_.queue_waits(nullptr);
}

bool Handover::job_fenced(const std::string& job) const {
  if (fenced_.empty()) return false;
  auto it = s_.jobs_.find(job);
  return it != s_.jobs_.end() && fenced_.count(it->second.spec.entitlement_id);
}

bool Handover::machine_fenced(MachineId m) const {
  return !fenced_.empty() && m < s_.alloc_.machine_count() &&
         fenced_.count(s_.alloc_.entitlement_of(m));
}

}  // namespace weft::cp
