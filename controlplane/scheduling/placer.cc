#include "controlplane/scheduling/placer.h"

#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

Command Placer::start_cmd(const JobRecord& j, const TaskRecord& t) const {
  if (!j.run_body || j.run_body_generation != j.generation) {
    j.run_body = std::make_shared<const std::string>(weft::task_run_body(j.spec));
    j.run_body_generation = j.generation;
  }
  Command c{Command::Kind::kStart, t.machine, t.id, {}, j.run_body, {}};
  c.ports = t.ports.empty() ? j.spec.ports : t.ports;
  return c;
}

Result<std::vector<Command>> Placer::converge(JobRecord& j, uint64_t now) {
  // A periodic job is a template (its runs are jobs of their own); an ended batch job
  // runs nothing again.
  if (j.spec.periodic || j.ended()) return std::vector<Command>{};
  Request r;
  r.job = j.spec.name;
  r.generation = 1;  // placement slots outlive spec generations (see update)
  r.entitlement = j.spec.entitlement_id;
  r.tasks = j.spec.count;
  r.per_task = {j.spec.per_task.cpu_milli, j.spec.per_task.mem_mb};
  r.machine_type = j.spec.machine_type;
  r.spread = j.spec.placement == weft::PlacementPolicy::kSpread;
  r.opportunistic = j.spec.is_batch() && j.spec.batch.opportunistic;
  if (dc_of_) r.dc = dc_of_(j.spec.entitlement_id);
  for (const auto& [name, port] : j.spec.ports) {
    if (port)
      r.fixed_ports.push_back(port);
    else
      ++r.dynamic_ports;
  }
  TRY_ASSIGN(Placement p, s_.alloc_.allocate(r));
  // An index is taken while a task of it is live or stopping, or its start was refused
  // under this generation's spec (the same spec would be refused again: it waits for an
  // update).
  std::set<int> have;
  s_.table_.for_job(j.spec.name, [&](TaskRecord& t) {
    if (task_live(t.state) || t.state == TaskState::kStopping || refused(t, j))
      have.insert(t.index);
  });
  // An index whose task failed or was lost is s_.replacement_.replace()'s, which takes a token from
  // the destructive-operation budget: converging must not start it for free (that path once
  // replaced a failing job's tasks ~950 times in 25 s).
  for (const auto& id : s_.replacement_.waiting_)
    if (auto w = s_.table_.find(id); w != s_.table_.end() && w->second.job == j.spec.name)
      have.insert(w->second.index);
  // Nor an index whose old copy may still run on a machine cut off (an at-most-one job's
  // lost task, fenced until its machine's lease ends): that would be two copies.
  for (const auto& [id, f] : s_.replacement_.fenced_)
    if (auto w = s_.table_.find(id); w != s_.table_.end() && w->second.job == j.spec.name)
      have.insert(w->second.index);
  std::vector<Command> out;
  // A batch job starts no more tasks than its completions still need.
  int room = j.spec.is_batch()
                 ? j.spec.batch.completions - j.progress.succeeded - static_cast<int>(have.size())
                 : j.wanted();
  for (int i = 0; i < j.wanted() && room > 0; ++i) {
    if (have.count(i)) continue;
    --room;
    // Its slot is on a drained machine (an update's restart performed there after the
    // drain began): the new task starts elsewhere, or waits there if nothing has room.
    if (s_.moves_.drained_.count(p.machines[static_cast<size_t>(i)]))
      if (auto moved = s_.alloc_.move_tasks(j.spec.name, {i}); moved.ok())
        p = std::move(moved).value();
    TaskRecord t;
    t.job = j.spec.name;
    t.index = i;
    t.generation = j.generation;
    t.machine = p.machines[static_cast<size_t>(i)];
    t.id = weft::make_task_id(j.spec.name, i, ++s_.seq_);
    t.since_us = now;
    launch(j, t, &out);
  }
  preempt_guests(now, &out);
  return out;
}

void Placer::preempt_guests(uint64_t now, std::vector<Command>* out) {
  for (const Eviction& e : s_.alloc_.take_evictions()) {
    auto jit = s_.jobs_.find(e.job);
    if (jit == s_.jobs_.end()) continue;
    const uint64_t notice = jit->second.spec.batch.notice_us;
    s_.table_.for_job(e.job, [&](TaskRecord& t) {
      if (t.index != e.index || t.machine != e.machine || !task_live(t.state)) return;
      t.preempted = true;
      t.since_us = now;
      s_.table_.set_state(t, TaskState::kStopping);
      s_.reported_changes_.insert(t.job);
      s_.table_.event(t, "taken back",
                      "its machine's owner needs the room: " + std::to_string(notice / 1'000'000) +
                          " s to finish, then it runs elsewhere");
      out->push_back(Command{
          Command::Kind::kStop, t.machine, t.id, {{"grace", static_cast<double>(notice) / 1e6}}});
    });
  }
}

void Placer::launch(const JobRecord& j, TaskRecord t, std::vector<Command>* out) {
  t.entitlement = j.spec.entitlement_id;  // (a created job is in s_.jobs_ only after this)
  // Its ports: the job's fixed ones, and those its index holds on this machine.
  t.ports.clear();
  auto dynamic = s_.alloc_.dynamic_ports(j.spec.name, t.index);
  size_t k = 0;
  for (const auto& [name, port] : j.spec.ports)
    t.ports[name] = port ? port : k < dynamic.size() ? dynamic[k++] : 0;
  if (!ready_ || ready_(t.machine)) {
    t.state = TaskState::kStarting;  // a new record: put_task counts and marks it
    out->push_back(start_cmd(j, t));
  } else {
    t.state = TaskState::kPending;
  }
  s_.table_.event(t, "placed", s_.alloc_.spec(t.machine).name);
  s_.table_.put(t);
}

std::vector<Command> Placer::machine_ready(MachineId m, uint64_t now) {
  std::vector<Command> out;
  if (s_.handover_.machine_fenced(m)) return out;
  s_.table_.for_machine(m, [&](TaskRecord& t) {
    if (t.state != TaskState::kPending) return;
    auto jit = s_.jobs_.find(t.job);
    if (jit == s_.jobs_.end()) return;
    s_.table_.set_state(t, TaskState::kStarting);
    t.since_us = now;
    out.push_back(start_cmd(jit->second, t));
  });
  return out;
}

void Placer::launch_copy(JobRecord& j, const TaskRecord& old, MachineId machine, uint64_t now,
                         std::vector<Command>* out) {
  TaskRecord t;
  t.job = old.job;
  t.index = old.index;
  t.generation = j.generation;
  t.machine = machine;
  t.id = weft::make_task_id(old.job, old.index, ++s_.seq_);
  t.since_us = now;
  if (old.generation == j.generation) {  // a new spec starts the count again
    t.setup_failures = old.setup_failures;
    t.setup_reason = old.setup_reason;
  }
  launch(j, t, out);
}

std::vector<Command> Placer::machine_unprepared(MachineId m, const std::string& why, uint64_t now) {
  std::vector<Command> out;
  std::vector<std::string> waiting;
  s_.table_.for_machine(m, [&](TaskRecord& t) {
    if (t.state != TaskState::kPending) return;
    s_.table_.set_state(t, TaskState::kLost);
    t.since_us = now;
    t.message = why;
    s_.reported_changes_.insert(t.job);
    waiting.push_back(t.id);
  });
  for (const auto& id : waiting) s_.replacement_.replace(id, now, &out);
  return out;
}

}  // namespace weft::cp
