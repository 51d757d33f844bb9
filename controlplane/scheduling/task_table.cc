#include "controlplane/scheduling/task_table.h"

namespace weft::cp {

std::vector<TaskRecord> TaskTable::of_job(const std::string& job) const {
  std::vector<TaskRecord> out;
  if (auto j = job_tasks_.find(job); j != job_tasks_.end())
    for (const auto& entry : j->second) out.push_back(*entry.second);
  return out;
}

std::vector<const TaskRecord*> TaskTable::refs_of(const std::string& job) const {
  std::vector<const TaskRecord*> out;
  if (auto j = job_tasks_.find(job); j != job_tasks_.end()) {
    out.reserve(j->second.size());
    for (const auto& entry : j->second) out.push_back(entry.second);
  }
  return out;
}

std::vector<TaskRecord> TaskTable::on(MachineId m) const {
  std::vector<TaskRecord> out;
  if (auto it = machine_tasks_.find(m); it != machine_tasks_.end())
    for (const auto& entry : it->second) out.push_back(*entry.second);
  return out;
}

void TaskTable::put(const TaskRecord& given, EntitlementId job_entitlement) {
  TaskRecord t = given;
  if (t.entitlement == 0) {
    if (auto existing = tasks_.find(t.id); existing != tasks_.end())
      t.entitlement = existing->second.entitlement;
    else
      t.entitlement = job_entitlement;
  }
  dirty_.insert(t.id);
  service_changes_.insert(t.job);
  ++by_state_[static_cast<size_t>(t.state)];
  if (auto it = tasks_.find(t.id); it != tasks_.end()) {
    --by_state_[static_cast<size_t>(it->second.state)];
    it->second = t;  // ids are unique; a task's job, index and machine never change
    return;
  }
  TaskRecord* stored = &tasks_.emplace(t.id, t).first->second;
  job_tasks_[t.job].emplace(std::pair{t.index, t.id}, stored);
  machine_tasks_[t.machine].emplace(t.id, stored);
}

void TaskTable::erase(const std::string& id) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  const TaskRecord& t = it->second;
  service_changes_.insert(t.job);
  if (auto j = job_tasks_.find(t.job); j != job_tasks_.end()) {
    j->second.erase(std::pair{t.index, id});
    if (j->second.empty()) job_tasks_.erase(j);
  }
  if (auto m = machine_tasks_.find(t.machine); m != machine_tasks_.end()) {
    m->second.erase(id);
    if (m->second.empty()) machine_tasks_.erase(m);
  }
  --by_state_[static_cast<size_t>(t.state)];
  if (erased_.emplace(id, Erased{t.machine, t.entitlement}).second) {
    erased_order_.push_back(id);
    if (erased_order_.size() > kErasedKept) {
      erased_.erase(erased_order_.front());
      erased_order_.pop_front();
    }
  }
  tasks_.erase(it);
}

std::vector<TaskEvent> TaskTable::take_events() {
  std::vector<TaskEvent> out(std::make_move_iterator(events_.begin()),
                             std::make_move_iterator(events_.end()));
  events_.clear();
  for (auto& e : out)
    if (e.detail.empty())
      if (auto it = tasks_.find(e.task); it != tasks_.end() && !it->second.message.empty() &&
                                         e.what == task_state_name(it->second.state))
        e.detail = it->second.message;
  return out;
}

}  // namespace weft::cp
