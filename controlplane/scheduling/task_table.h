// The scheduler's tasks (scheduler.h): every task record by id, indexed by job (in index
// and id order) and by machine (in id order), counted by state, and what changed since
// the daemon last looked (the rows to write, the jobs whose endpoints to publish, the
// events to show). Where a task that is gone ran is remembered a while (erased_on).
#pragma once

#include <array>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "controlplane/scheduling/records.h"

namespace weft::cp {

class TaskTable {
 public:
  using Tasks = std::unordered_map<std::string, TaskRecord>;
  // A job's tasks by (index, id), and a machine's by id: pointers into the table (its
  // nodes do not move).
  using JobIndex = std::map<std::string, std::map<std::pair<int, std::string>, TaskRecord*>>;
  using MachineIndex = std::unordered_map<MachineId, std::map<std::string, TaskRecord*>>;

  // Read as the map it is (a report looks up each of its tasks: hashing, not a tree walk
  // of string compares).
  Tasks::const_iterator find(const std::string& id) const { return tasks_.find(id); }
  Tasks::iterator find(const std::string& id) { return tasks_.find(id); }
  Tasks::const_iterator begin() const { return tasks_.begin(); }
  Tasks::const_iterator end() const { return tasks_.end(); }
  Tasks::iterator end() { return tasks_.end(); }
  const TaskRecord& at(const std::string& id) const { return tasks_.at(id); }
  TaskRecord& at(const std::string& id) { return tasks_.at(id); }
  size_t count(const std::string& id) const { return tasks_.count(id); }
  size_t size() const { return tasks_.size(); }
  bool empty() const { return tasks_.empty(); }
  const JobIndex& by_job() const { return job_tasks_; }
  const MachineIndex& by_machine() const { return machine_tasks_; }

  // A job's tasks in (index, id) order, a machine's in id order; refs_of without copies
  // (valid until the table changes).
  std::vector<TaskRecord> of_job(const std::string& job) const;
  std::vector<const TaskRecord*> refs_of(const std::string& job) const;
  std::vector<TaskRecord> on(MachineId m) const;
  template <class F>
  void for_job(const std::string& job, F&& f) {
    if (auto j = job_tasks_.find(job); j != job_tasks_.end())
      for (const auto& entry : j->second) f(*entry.second);
  }
  template <class F>
  void for_machine(MachineId m, F&& f) {
    if (auto it = machine_tasks_.find(m); it != machine_tasks_.end())
      for (const auto& entry : it->second) f(*entry.second);
  }
  // How many tasks are in state s (for metrics: no walk).
  size_t count_in(TaskState s) const { return by_state_[static_cast<size_t>(s)]; }

  // A new or changed record. One without its entitlement (a copy made elsewhere, a row
  // restored from the store) keeps the one it had, or takes `job_entitlement`.
  void put(const TaskRecord& t, EntitlementId job_entitlement = 0);
  void erase(const std::string& id);
  void set_state(TaskRecord& t, TaskState s) {
    --by_state_[static_cast<size_t>(t.state)];
    ++by_state_[static_cast<size_t>(s)];
    t.state = s;
    dirty_.insert(t.id);
    service_changes_.insert(t.job);
    event(t, task_state_name(s));
  }
  void service_changed(const std::string& job) { service_changes_.insert(job); }

  // Something happened to a task, or to a job itself (task ""): a batch job's end, a
  // period's run or skip, a rollout's step.
  void event(const TaskRecord& t, std::string what, std::string detail = "") {
    if (events_.size() >= kEventsKept) events_.pop_front();
    events_.push_back(TaskEvent{t.job, t.id, t.machine, std::move(what), std::move(detail)});
  }
  void job_event(const std::string& job, std::string what, std::string detail) {
    if (events_.size() >= kEventsKept) events_.pop_front();
    events_.push_back(TaskEvent{job, "", 0, std::move(what), std::move(detail)});
  }
  // What happened since the last call, in order (at most kEventsKept: the oldest go first
  // when nobody takes them). A state event's detail is the task's message when it has
  // one (why it failed).
  std::vector<TaskEvent> take_events();
  static constexpr size_t kEventsKept = 100000;
  // Tasks created or changed since the last call: what the daemon writes.
  std::unordered_set<std::string> take_dirty() { return std::exchange(dirty_, {}); }
  // Jobs whose published endpoints may have changed since the last call: a task became
  // ready or not, started, stopped, ended, or moved (controlplane/discovery/service_table.h).
  std::set<std::string> take_service_changes() { return std::exchange(service_changes_, {}); }

  // Where a task that is no longer kept ran (the last kErasedKept), and the entitlement
  // its job was in then: its output may still be on that machine (task.logs), and it
  // belongs to that entitlement, whatever job carries the name now (0: its job was
  // already gone, so no entitlement's owners may read it).
  struct Erased {
    MachineId machine = 0;
    EntitlementId entitlement = 0;
  };
  std::optional<Erased> erased_on(const std::string& id) const {
    auto it = erased_.find(id);
    if (it == erased_.end()) return std::nullopt;
    return it->second;
  }
  static constexpr size_t kErasedKept = 4096;

 private:
  Tasks tasks_;
  JobIndex job_tasks_;
  MachineIndex machine_tasks_;
  std::array<size_t, weft::kTaskStateCount> by_state_{};
  std::unordered_set<std::string> dirty_;
  std::set<std::string> service_changes_;
  std::deque<TaskEvent> events_;
  std::unordered_map<std::string, Erased> erased_;
  std::deque<std::string> erased_order_;
};

}  // namespace weft::cp
