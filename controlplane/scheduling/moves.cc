#include "controlplane/scheduling/moves.h"

#include <algorithm>

#include "common/log.h"
#include "common/rpc/protocol.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

std::vector<Command> Moves::machine_drain(MachineId m, uint64_t now) {
  std::vector<Command> out;
  if (s_.handover_.machine_fenced(m)) return out;
  drained_.insert(m);
  std::vector<std::string> move;
  std::vector<std::pair<std::string, int>> slots;
  s_.table_.for_machine(m, [&](TaskRecord& t) {
    if (t.state == TaskState::kStopping) {
      // Being stopped for an update or a scale-down: what starts in its slot next must
      // not start here (it would wait for this machine forever).
      auto jit = s_.jobs_.find(t.job);
      if (jit != s_.jobs_.end() && !jit->second.stopping && t.index < jit->second.spec.count)
        slots.emplace_back(t.job, t.index);
      return;
    }
    if (t.state == TaskState::kPending) {  // never started: just place it elsewhere
      s_.table_.set_state(t, TaskState::kStopped);
      t.since_us = now;
      move.push_back(t.id);
    } else if (t.state == TaskState::kStarting || t.state == TaskState::kRunning) {
      auto jit = s_.jobs_.find(t.job);
      if (jit != s_.jobs_.end() && jit->second.controlled()) {
        jit->second.moves.insert(t.id);  // its controller says when (pending_operations)
        return;
      }
      if (jit != s_.jobs_.end() && jit->second.spec.at_most_one()) {
        stop_first(t, now, &out);
        slots.emplace_back(t.job, t.index);  // its next copy starts elsewhere
        return;
      }
      s_.table_.set_state(t, TaskState::kDraining);
      t.since_us = now;
      move.push_back(t.id);
    }
  });
  for (const auto& id : move) s_.replacement_.replace(id, now, &out);
  for (const auto& [job, index] : slots) {
    auto placed = s_.alloc_.placement(job);
    if (static_cast<size_t>(index) < placed.size() && placed[static_cast<size_t>(index)] == m)
      (void)s_.alloc_.move_tasks(job, {index});  // no room: it waits for the machine
  }
  return out;
}

void Moves::machine_undrained(MachineId m) {
  drained_.erase(m);
  s_.table_.for_machine(m, [&](TaskRecord& t) {
    if (auto jit = s_.jobs_.find(t.job); jit != s_.jobs_.end()) jit->second.moves.erase(t.id);
  });
}

std::vector<Command> Moves::machine_evict(MachineId m, uint64_t now) {
  std::vector<Command> out;
  if (s_.handover_.machine_fenced(m)) return out;
  std::vector<std::string> ids;
  s_.table_.for_machine(m, [&](TaskRecord& t) { ids.push_back(t.id); });
  for (const auto& id : ids) {
    TaskRecord& t = s_.table_.at(id);
    auto jit = s_.jobs_.find(t.job);
    if (t.state == TaskState::kPending) {  // never started: placed elsewhere
      s_.table_.set_state(t, TaskState::kStopped);
      t.since_us = now;
      s_.replacement_.replace(id, now, &out);
      continue;
    }
    if (t.state == TaskState::kStarting || t.state == TaskState::kRunning) {
      if (jit != s_.jobs_.end()) jit->second.moves.erase(id);
      if (jit == s_.jobs_.end() || !move_now(jit->second, id, now, &out)) continue;
    }
    if (t.state == TaskState::kDraining) {
      s_.table_.set_state(t, TaskState::kStopping);
      t.since_us = now;
      out.push_back(Command{Command::Kind::kStop, m, id, {}});
      s_.reported_changes_.insert(t.job);
    }
  }
  return out;
}

bool Moves::move_now(JobRecord& j, const std::string& id, uint64_t now, std::vector<Command>* out) {
  auto it = s_.table_.find(id);
  if (it == s_.table_.end() || !task_live(it->second.state) ||
      it->second.state == TaskState::kPending)
    return false;
  TaskRecord& t = it->second;
  j.in_progress[t.index] = "move/" + id;
  if (j.spec.at_most_one()) {
    stop_first(t, now, out);  // its slot moves off the drained machine in converge
    return true;
  }
  s_.table_.set_state(t, TaskState::kDraining);  // make before break: it stops once its copy runs
  t.since_us = now;
  s_.replacement_.replace(id, now, out);
  return true;
}

void Moves::stop_first(TaskRecord& t, uint64_t now, std::vector<Command>* out) {
  s_.table_.set_state(t, TaskState::kStopping);
  t.since_us = now;
  t.moving = true;
  s_.table_.event(t, "moving", "at most one copy: it stops before its index starts elsewhere");
  s_.reported_changes_.insert(t.job);
  out->push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
}

Result<std::vector<Command>> Moves::move_task(const std::string& id, MachineId to,
                                              const std::string& reason, uint64_t now) {
  auto it = s_.table_.find(id);
  if (it == s_.table_.end()) return field_error("task", "no such task: " + id);
  TaskRecord& t = it->second;
  auto jit = s_.jobs_.find(t.job);
  if (jit == s_.jobs_.end() || jit->second.stopping)
    return field_error("task", "its job " + t.job + " is stopping");
  JobRecord& j = jit->second;
  if (s_.handover_.job_fenced(t.job)) return moving_error();
  if (!available(t)) return field_error("task", id + " is not running and ready");
  if (t.generation != j.generation || j.rolling)
    return field_error("task", "its job " + t.job + " is being updated");
  if (to >= s_.alloc_.machine_count()) return field_error("machine", "no such machine");
  if (to == t.machine) return field_error("machine", "the task runs there already");
  if (s_.alloc_.entitlement_of(to) != j.spec.entitlement_id)
    return field_error("machine", s_.alloc_.spec(to).name + " is not in the job's entitlement");
  // Never more than max_unavailable of the job's indices unavailable, this move (its
  // task drains while its copy starts) and those asked of its controller counted: a
  // move never takes a job below count - max_unavailable ready tasks. Not while a
  // drain's moves or a shrink wait for its controller.
  if (!j.moves.empty() || j.shrink_to)
    return field_error("task", "its job " + t.job + " is being drained or shrunk");
  int ready = 0;
  s_.table_.for_job(t.job, [&](TaskRecord& o) { ready += available(o) && o.index < j.spec.count; });
  const int unavailable = j.spec.count - ready + static_cast<int>(j.retargets.size());
  if (unavailable + 1 > std::max(1, j.spec.max_unavailable))
    return field_error("task", "its job " + t.job + " has " + std::to_string(unavailable) +
                                   " tasks not ready or moving (max_unavailable " +
                                   std::to_string(j.spec.max_unavailable) + ")");
  if (!s_.replacement_.tokens_.take(now))
    return make_error("the destructive-operation budget is spent for now")
        .with_code(rpc::kUnavailable);
  std::vector<Command> out;
  s_.table_.event(t, "move asked", reason);
  if (j.controlled()) {
    j.retargets[id] = JobRecord::Retarget{to, reason};  // its controller says when
    return out;
  }
  TRY(move_to(j, t, to, now, &out));
  return out;
}

Status Moves::move_to(JobRecord& j, TaskRecord& t, MachineId to, uint64_t now,
                      std::vector<Command>* out) {
  TRY(s_.alloc_.move_task_to(j.spec.name, t.index, to));
  if (j.spec.controller) j.in_progress[t.index] = "move/" + t.id;
  if (j.spec.at_most_one()) {  // break before make: its index starts at `to` once it stopped
    stop_first(t, now, out);
    return {};
  }
  s_.table_.set_state(t,
                      TaskState::kDraining);  // make before break: it stops once its copy is ready
  t.since_us = now;
  s_.reported_changes_.insert(t.job);
  const TaskRecord old = t;
  s_.placer_.launch_copy(j, old, to, now, out);
  return {};
}

bool Moves::withdraw_move(const std::string& id) {
  auto it = s_.table_.find(id);
  if (it == s_.table_.end()) return false;
  auto jit = s_.jobs_.find(it->second.job);
  return jit != s_.jobs_.end() && jit->second.retargets.erase(id) > 0;
}

bool Moves::moving(const std::string& id) const {
  auto it = s_.table_.find(id);
  if (it == s_.table_.end()) return false;
  if (it->second.state == TaskState::kDraining) return true;
  if (it->second.state == TaskState::kStopping && it->second.moving) return true;
  auto jit = s_.jobs_.find(it->second.job);
  return jit != s_.jobs_.end() && jit->second.retargets.count(id) > 0;
}

void Moves::stop_drained_sibling(const TaskRecord& t, uint64_t now, std::vector<Command>* out) {
  auto j = s_.table_.by_job().find(t.job);
  if (j == s_.table_.by_job().end()) return;
  for (auto it = j->second.lower_bound({t.index, std::string()});
       it != j->second.end() && it->first.first == t.index; ++it) {
    TaskRecord& other = *it->second;
    if (other.state != TaskState::kDraining || other.id == t.id) continue;
    s_.table_.set_state(other, TaskState::kStopping);
    other.since_us = now;
    out->push_back(Command{Command::Kind::kStop, other.machine, other.id, {}});
  }
}

}  // namespace weft::cp
