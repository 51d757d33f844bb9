#include "controlplane/scheduling/replacement.h"

#include "common/log.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

void Replacement::replace(const std::string& task_id, uint64_t now, std::vector<Command>* out,
                          bool prepaid) {
  TaskRecord old = s_.table_.at(task_id);
  auto jit = s_.jobs_.find(old.job);
  if (jit == s_.jobs_.end() || jit->second.stopping || old.index >= jit->second.wanted() ||
      jit->second.ended())
    return;
  if (jit->second.spec.is_batch() &&
      jit->second.progress.failed > jit->second.spec.batch.max_failures)
    return;  // past its budget: the job fails (check_batch)
  if (auto f = fenced_.find(task_id); f != fenced_.end()) {
    if (!f->second.ended && now < lease_end_(old.machine)) return;  // release_fenced
    fenced_.erase(f);
  }
  if (!prepaid && !tokens_.take(now)) {
    wait(task_id);
    return;
  }
  auto p = s_.alloc_.move_tasks(old.job, {old.index});
  if (!p.ok()) {  // no room now: try again at the next tick
    wait(task_id);
    return;
  }
  s_.placer_.launch_copy(jit->second, old, p->machines[static_cast<size_t>(old.index)], now, out);
  s_.placer_.preempt_guests(now, out);
  if (waiting_set_.erase(task_id))
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), task_id), waiting_.end());
}

std::vector<Command> Replacement::machine_down(MachineId m, uint64_t now, bool prepaid) {
  std::vector<Command> out;
  if (s_.handover_.machine_fenced(m)) return out;
  std::vector<std::string> lost;
  std::set<std::string> stopped_jobs;
  LostNote noted;
  auto at_most_one = [&](const TaskRecord& t) {
    auto j = s_.jobs_.find(t.job);
    return lease_end_ && j != s_.jobs_.end() && j->second.spec.at_most_one();
  };
  s_.table_.for_machine(m, [&](TaskRecord& t) {
    // A stop not confirmed is no stop for a job of at most one copy: the task may run on
    // there until the lease ends, and its index waits for that as a lost task does.
    bool unconfirmed = t.state == TaskState::kStopping && at_most_one(t);
    if (task_live(t.state) || unconfirmed) {
      if (unconfirmed) stopped_jobs.insert(t.job);  // a stopping job may end meanwhile
      noted.add(t);
      s_.table_.set_state(t, TaskState::kLost);
      t.since_us = now;
      lost.push_back(t.id);
    } else if (t.state == TaskState::kStopping || t.state == TaskState::kDraining) {
      s_.table_.set_state(t, TaskState::kStopped);  // a draining copy's replacement exists or waits
      t.since_us = now;
      stopped_jobs.insert(t.job);
    }
  });
  if (!lost.empty())
    log_info("tasks lost: their machine is down", {{"MACHINE", std::to_string(m)},
                                                   {"LOST", std::to_string(noted.count)},
                                                   {"TASKS", noted.named}});
  for (const auto& id : lost) {
    if (at_most_one(s_.table_.at(id))) fence(id, prepaid);
    replace(id, now, &out, prepaid);
  }
  for (const auto& job : stopped_jobs) {
    auto more = s_.after_stopped(job, now);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

void Replacement::queue_waits(const std::string* only) {
  std::map<std::pair<std::string, int>, const TaskRecord*> latest;  // by job and index
  std::set<std::pair<std::string, int>> running;
  auto each = [&](const TaskRecord& t) {
    auto key = std::pair{t.job, t.index};
    if (task_live(t.state)) running.insert(key);
    auto it = latest.find(key);
    if (it == latest.end() || it->second->since_us < t.since_us) latest[key] = &t;
  };
  if (only)
    s_.table_.for_job(*only, each);
  else
    for (const auto& [id, t] : s_.table_) each(t);
  for (const auto& [key, t] : latest) {
    auto jit = s_.jobs_.find(key.first);
    if (jit == s_.jobs_.end() || jit->second.stopping || jit->second.ended() ||
        key.second >= jit->second.wanted() || running.count(key) || refused(*t, jit->second))
      continue;
    // A lost task of an at-most-one job (restored: the lease that fenced it here was
    // granted by the control plane before this one) waits for its machine's lease as
    // this control plane counts it.
    if (t->state == TaskState::kLost && lease_end_ && jit->second.spec.at_most_one())
      fence(t->id, false);
    if (t->state == TaskState::kLost || t->state == TaskState::kFailed ||
        t->state == TaskState::kDraining)
      wait(t->id);
  }
}

void Replacement::fence(const std::string& task_id, bool prepaid) {
  fenced_.emplace(task_id, Fenced{prepaid, false});
}

void Replacement::copy_ended(const std::string& id) {
  if (auto f = fenced_.find(id); f != fenced_.end()) f->second.ended = true;
}

bool Replacement::fenced_due(uint64_t now) const {
  for (const auto& [id, f] : fenced_) {
    auto t = s_.table_.find(id);
    if (f.ended || t == s_.table_.end() || now >= lease_end_(t->second.machine)) return true;
  }
  return false;
}

void Replacement::release_fenced(uint64_t now, std::vector<Command>* out) {
  std::vector<std::pair<std::string, bool>> due;
  for (auto it = fenced_.begin(); it != fenced_.end();) {
    auto t = s_.table_.find(it->first);
    if (t == s_.table_.end() || t->second.state != TaskState::kLost) {
      it = fenced_.erase(it);  // gone, or no longer lost (its job stopped, say)
      continue;
    }
    if (it->second.ended || now >= lease_end_(t->second.machine))
      due.emplace_back(it->first, it->second.prepaid);
    ++it;
  }
  for (const auto& [id, prepaid] : due) {
    auto t = s_.table_.find(id);
    log_info(
        "a lost task of an at-most-one job is replaced: its machine's lease ended or its copy "
        "there ended",
        {{"TASK_ID", id}, {"MACHINE", std::to_string(t->second.machine)}});
    replace(id, now, out, prepaid);
    fenced_.erase(id);  // placed, or waiting for room or budget like any replacement
  }
}

void Replacement::wait(const std::string& task_id) {
  if (waiting_set_.insert(task_id).second) waiting_.push_back(task_id);
}

void Replacement::retry(uint64_t now, std::vector<Command>* out) {
  if (!fenced_.empty()) release_fenced(now, out);
  // Oldest first, while the budget lasts: what is left keeps its place in the queue.
  std::vector<std::string> waiting = std::exchange(waiting_, {});
  waiting_set_.clear();
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (!tokens_.peek(now)) {
      for (size_t j = i; j < waiting.size(); ++j) wait(waiting[j]);
      break;
    }
    auto t = s_.table_.find(waiting[i]);
    if (t == s_.table_.end()) continue;
    if (s_.handover_.job_fenced(t->second.job))
      wait(waiting[i]);  // its entitlement is moving: it waits on, here or there
    else
      replace(waiting[i], now, out);
  }
}

}  // namespace weft::cp
