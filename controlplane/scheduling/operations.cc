#include "controlplane/scheduling/operations.h"

#include <algorithm>

#include "common/log.h"
#include "common/rpc/protocol.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

Result<std::vector<Command>> Operations::restart_task(const std::string& id,
                                                      const std::string& reason, uint64_t now,
                                                      bool* waits) {
  *waits = false;
  auto it = s_.table_.find(id);
  if (it == s_.table_.end())
    return field_error("id", "no such task: " + id).with_code(rpc::kNotFound);
  TaskRecord& t = it->second;
  auto jit = s_.jobs_.find(t.job);
  if (jit == s_.jobs_.end() || jit->second.stopping)
    return field_error("id", "its job " + t.job + " is stopping");
  if (s_.handover_.job_fenced(t.job)) return moving_error();
  if (t.state != TaskState::kRunning && t.state != TaskState::kStarting)
    return field_error("id", id + " is " + task_state_name(t.state) + ", not running")
        .with_code(rpc::kConflict);
  JobRecord& j = jit->second;
  std::vector<Command> out;
  s_.table_.event(t, "restart asked", reason);
  if (j.controlled()) {
    j.restarts[id] = reason;  // its controller says when (pending_operations)
    *waits = true;
    return out;
  }
  s_.table_.set_state(t, TaskState::kStopping);  // its index starts again once it stopped
  t.since_us = now;
  s_.reported_changes_.insert(t.job);
  out.push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
  return out;
}

Result<std::vector<Command>> Operations::liveness_failed(const std::string& id,
                                                         const std::string& why, uint64_t now,
                                                         bool* waits) {
  *waits = false;
  auto it = s_.table_.find(id);
  if (it == s_.table_.end())
    return field_error("task", "no such task: " + id).with_code(rpc::kNotFound);
  auto jit = s_.jobs_.find(it->second.job);
  if (jit != s_.jobs_.end() && jit->second.restarts.count(id)) {
    *waits = true;  // asked of its controller already
    return std::vector<Command>{};
  }
  if (it->second.state != TaskState::kRunning)
    return field_error("task", id + " is " + task_state_name(it->second.state) + ", not running")
        .with_code(rpc::kConflict);
  if (!s_.replacement_.tokens_.take(now))
    return make_error("the budget for destructive operations is spent: restarted later")
        .with_code(rpc::kUnavailable);
  return restart_task(id, "liveness: " + why, now, waits);
}

std::vector<std::string> Operations::controlled_jobs() const {
  std::vector<std::string> out;
  for (const auto& [name, j] : s_.jobs_)
    if (j.spec.controller && !j.stopping && !s_.handover_.fenced(j.spec.entitlement_id))
      out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Operation> Operations::pending_operations(const std::string& job) const {
  std::vector<Operation> out;
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || !it->second.spec.controller || it->second.stopping) return out;
  const JobRecord& j = it->second;
  int allowed = s_.rollouts_.restarts_allowed(j);  // paused or canaries: only those it may do
  if (auto jt = s_.table_.by_job().find(job); jt != s_.table_.by_job().end())
    for (const auto& [key, t] : jt->second)
      if (t->generation < j.generation && task_live(t->state) && allowed-- > 0)
        out.push_back(Operation{"restart/" + t->id, "restart", t->id, t->index,
                                "update to generation " + std::to_string(j.generation)});
  for (const auto& id : j.moves)
    if (auto t = s_.table_.find(id); t != s_.table_.end() && task_live(t->second.state))
      out.push_back(Operation{"move/" + id, "move", id, t->second.index, "its machine is drained"});
  for (const auto& [id, why] : j.restarts)
    if (auto t = s_.table_.find(id);
        t != s_.table_.end() && task_live(t->second.state) && t->second.generation == j.generation)
      out.push_back(Operation{"restart/" + id, "restart", id, t->second.index, why});
  for (const auto& [id, r] : j.retargets)
    if (auto t = s_.table_.find(id);
        t != s_.table_.end() && task_live(t->second.state) && !j.moves.count(id))
      out.push_back(Operation{"move/" + id, "move", id, t->second.index, r.reason});
  // A guest taken back: told, not asked (its notice runs whatever the controller says).
  if (j.spec.batch.opportunistic)
    if (auto jt = s_.table_.by_job().find(job); jt != s_.table_.by_job().end())
      for (const auto& [key, t] : jt->second)
        if (t->preempted && t->state == TaskState::kStopping)
          out.push_back(Operation{"preempt/" + t->id, "preempt", t->id, t->index,
                                  "its machine's owner took the room back: it stops within " +
                                      std::to_string(j.spec.batch.notice_us / 1'000'000) +
                                      " s (SIGTERM now, SIGKILL then) and runs again elsewhere"});
  if (j.shrink_to)
    if (auto jt = s_.table_.by_job().find(job); jt != s_.table_.by_job().end())
      for (const auto& [key, t] : jt->second)
        if (t->index >= j.shrink_to && running_copy(t->state))
          out.push_back(Operation{"stop/" + t->id, "stop", t->id, t->index,
                                  "scale down from " + std::to_string(j.spec.count) + " to " +
                                      std::to_string(j.shrink_to)});
  std::stable_sort(out.begin(), out.end(),
                   [](const Operation& a, const Operation& b) { return a.index < b.index; });
  return out;
}

std::vector<ControlledTask> Operations::controlled_tasks(const std::string& job) const {
  std::map<int, const TaskRecord*> newest;
  if (auto jt = s_.table_.by_job().find(job); jt != s_.table_.by_job().end())
    for (const auto& [key, t] : jt->second) {
      const TaskRecord*& n = newest[t->index];
      // A running copy wins over a newer one that is not running (a drain's replacement
      // starting, say); otherwise the newest.
      bool better = !n || (running_copy(t->state) && !running_copy(n->state)) ||
                    (running_copy(t->state) == running_copy(n->state) && n->since_us < t->since_us);
      if (better) n = t;
    }
  std::vector<ControlledTask> out;
  for (const auto& [index, t] : newest)
    out.push_back(ControlledTask{t->id, index, "", t->machine, t->generation, t->state, t->message,
                                 t->ready});
  return out;
}

std::vector<std::string> Operations::take_completed(const std::string& job) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end()) return {};
  JobRecord& j = it->second;
  for (auto op = j.in_progress.begin(); op != j.in_progress.end();) {
    bool back = false;
    s_.table_.for_job(job, [&](TaskRecord& t) {
      back = back || (t.index == op->first && t.generation == j.generation && available(t));
    });
    if (back) {
      j.completed.push_back(op->second);
      op = j.in_progress.erase(op);
    } else {
      ++op;
    }
  }
  return std::exchange(j.completed, {});
}

std::vector<Command> Operations::grant(const std::string& job, const std::vector<std::string>& ids,
                                       uint64_t now) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || it->second.stopping || s_.handover_.job_fenced(job)) return {};
  JobRecord& j = it->second;
  std::set<std::string> pending;
  for (const auto& op : pending_operations(job)) pending.insert(op.id);
  std::erase_if(j.granted, [&](const std::string& id) { return !pending.count(id); });
  std::erase_if(j.moves, [&](const std::string& id) { return !pending.count("move/" + id); });
  std::erase_if(j.retargets, [&](const auto& r) { return !pending.count("move/" + r.first); });
  std::erase_if(j.restarts, [&](const auto& r) { return !pending.count("restart/" + r.first); });
  std::vector<Command> out;
  bool any = false;
  bool stopped = false;
  for (const auto& id : ids) {
    if (!pending.count(id) || id.rfind("preempt/", 0) == 0) continue;  // preempt: a notice
    if (id.rfind("stop/", 0) == 0) {
      if (auto t = s_.table_.find(id.substr(5));
          t != s_.table_.end() && running_copy(t->second.state)) {
        s_.table_.set_state(t->second, TaskState::kStopping);
        t->second.since_us = now;
        out.push_back(Command{Command::Kind::kStop, t->second.machine, t->second.id, {}});
        stopped = true;
      }
      continue;
    }
    if (id.rfind("move/", 0) == 0) {
      std::string task = id.substr(5);
      if (j.moves.erase(task)) {
        j.retargets.erase(task);
        s_.moves_.move_now(j, task, now, &out);
      } else if (auto r = j.retargets.find(task); r != j.retargets.end()) {
        MachineId to = r->second.to;
        j.retargets.erase(r);
        auto t = s_.table_.find(task);
        // Where it was to go may not take it any more: the move is dropped.
        if (t != s_.table_.end() && available(t->second))
          if (auto s = s_.moves_.move_to(j, t->second, to, now, &out); !s.ok())
            log_info("a rebalancing move was dropped",
                     {{"TASK", task}, {"ERROR", s.error().str()}});
      }
      continue;
    }
    any |= j.granted.insert(id).second;
  }
  if (any) {
    auto rolled = s_.rollouts_.roll(j, now);
    out.insert(out.end(), rolled.begin(), rolled.end());
  }
  if (stopped) finish_shrink(j, now, &out);
  return out;
}

void Operations::finish_shrink(JobRecord& j, uint64_t now, std::vector<Command>* out) {
  if (!j.shrink_to) return;
  bool left = false;
  s_.table_.for_job(
      j.spec.name, [&](TaskRecord& t) { left |= t.index >= j.shrink_to && running_copy(t.state); });
  if (left && j.controlled()) return;  // more to consent to
  // None of the indices above runs (or the controller is out of the way): the count
  // follows, and what still runs there stops now.
  auto r = s_.scale(j.spec.name, j.shrink_to, now);
  if (r.ok()) out->insert(out->end(), r->begin(), r->end());
}

std::vector<Command> Operations::set_control_fallback(const std::string& job, bool on,
                                                      uint64_t now) {
  auto it = s_.jobs_.find(job);
  if (it == s_.jobs_.end() || it->second.fallback == on || s_.handover_.job_fenced(job)) return {};
  JobRecord& j = it->second;
  j.fallback = on;
  j.granted.clear();    // an answer from before is not a permission for later
  j.retargets.clear();  // the ReBalancer's moves are not worth doing without consent
  // (An operator's restarts go on at max_unavailable pacing, as an update's do: roll.)
  if (!on || j.stopping) return {};
  // As for a job without a controller: drained machines' tasks move now, the update
  // rolls at max_unavailable pacing.
  std::vector<Command> out;
  for (const auto& id : std::exchange(j.moves, {})) s_.moves_.move_now(j, id, now, &out);
  auto rolled = s_.rollouts_.roll(j, now);
  out.insert(out.end(), rolled.begin(), rolled.end());
  finish_shrink(j, now, &out);
  return out;
}

bool Operations::control_fallback(const std::string& job) const {
  auto it = s_.jobs_.find(job);
  return it != s_.jobs_.end() && it->second.fallback;
}

}  // namespace weft::cp
