#include "controlplane/scheduling/scheduler.h"

#include "common/log.h"
#include "common/rpc/protocol.h"

#include <algorithm>

namespace weft::cp {

using json = nlohmann::json;

namespace {
// A task that has not shown up in its machine's report this long after the start was
// sent is lost (the start command or the machine went missing).
constexpr uint64_t kStartGraceUs = 60'000'000;
// A start its machine has not reported after this long is sent again (the machine was
// offline when it was due, or the command was lost); the agent refuses a duplicate name.
constexpr uint64_t kStartResendUs = 5'000'000;
// The tasks a machine's loss (or its report) declared lost, for one log line: the first
// 20 by id and state, and how many in all (a machine may run hundreds).
struct LostNote {
  std::string named;
  size_t count = 0;
  void add(const TaskRecord& t) {
    if (++count <= 20)
      named += (named.empty() ? "" : ", ") + t.id + " (" + task_state_name(t.state) + ")";
  }
};
}  // namespace

Error Scheduler::moving_error() {
  return make_error(
             "its entitlement is moving to another shard: try again in a few seconds "
             "(weftctl entitlement show)")
      .with_code(rpc::kUnavailable);
}

bool Scheduler::refused(const TaskRecord& t, const Job& j) {
  return t.state == TaskState::kFailed && t.held && t.generation == j.generation;
}

Command Scheduler::start_cmd(const Job& j, const TaskRecord& t) const {
  if (!j.run_body || j.run_body_generation != j.generation) {
    j.run_body = std::make_shared<const std::string>(weft::task_run_body(j.spec));
    j.run_body_generation = j.generation;
  }
  Command c{Command::Kind::kStart, t.machine, t.id, {}, j.run_body, {}};
  c.ports = t.ports.empty() ? j.spec.ports : t.ports;
  return c;
}

std::vector<TaskRecord> Scheduler::tasks_of(const std::string& job) const {
  std::vector<TaskRecord> out;
  if (auto j = job_tasks_.find(job); j != job_tasks_.end())
    for (const auto& entry : j->second) out.push_back(*entry.second);
  return out;
}

std::vector<const TaskRecord*> Scheduler::task_refs_of(const std::string& job) const {
  std::vector<const TaskRecord*> out;
  if (auto j = job_tasks_.find(job); j != job_tasks_.end()) {
    out.reserve(j->second.size());
    for (const auto& entry : j->second) out.push_back(entry.second);
  }
  return out;
}

std::vector<TaskRecord> Scheduler::tasks_on(MachineId m) const {
  std::vector<TaskRecord> out;
  if (auto it = machine_tasks_.find(m); it != machine_tasks_.end())
    for (const auto& entry : it->second) out.push_back(*entry.second);
  return out;
}

void Scheduler::put_task(const TaskRecord& given) {
  TaskRecord t = given;
  // A record without its entitlement (a copy made elsewhere, a row restored from the
  // store) keeps the one it had, or takes its job's.
  if (t.entitlement == 0) {
    if (auto existing = tasks_.find(t.id); existing != tasks_.end())
      t.entitlement = existing->second.entitlement;
    else if (auto j = jobs_.find(t.job); j != jobs_.end())
      t.entitlement = j->second.spec.entitlement_id;
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

void Scheduler::erase_task(const std::string& id) {
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

void Scheduler::restore_task(const TaskRecord& t) {
  put_task(t);
}

std::optional<Scheduler::PersistedJob> Scheduler::persisted_job(const std::string& name) const {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return std::nullopt;
  return PersistedJob{it->second.spec, it->second.generation, it->second.stopping,
                      it->second.progress};
}

std::vector<Scheduler::PersistedJob> Scheduler::persisted_jobs() const {
  std::vector<PersistedJob> out;
  for (const auto& [name, j] : jobs_) out.push_back({j.spec, j.generation, j.stopping, j.progress});
  return out;
}

void Scheduler::restore_job(const PersistedJob& p) {
  Job j;
  j.spec = p.spec;
  j.generation = p.generation;
  j.stopping = p.stopping;
  j.rolling = true;
  j.progress = p.progress;
  if (j.spec.is_batch() && !j.spec.periodic && !j.ended()) batch_idle_.insert(j.spec.name);
  jobs_[p.spec.name] = std::move(j);
}

std::optional<JobSpec> Scheduler::job(const std::string& name) const {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.spec;
}

uint64_t Scheduler::generation(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.generation;
}

Result<std::vector<Command>> Scheduler::converge(Job& j, uint64_t now) {
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
  TRY_ASSIGN(Placement p, alloc_.allocate(r));
  // An index is taken while a task of it is live or stopping, or its start was refused
  // under this generation's spec (the same spec would be refused again: it waits for an
  // update).
  std::set<int> have;
  for_job(j.spec.name, [&](TaskRecord& t) {
    if (task_live(t.state) || t.state == TaskState::kStopping || refused(t, j))
      have.insert(t.index);
  });
  // An index whose task failed or was lost is replace()'s, which takes a token from the
  // destructive-operation budget: converging must not start it for free (that path
  // once replaced a failing job's tasks ~950 times in 25 s).
  for (const auto& id : waiting_)
    if (auto w = tasks_.find(id); w != tasks_.end() && w->second.job == j.spec.name)
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
    if (drained_.count(p.machines[static_cast<size_t>(i)]))
      if (auto moved = alloc_.move_tasks(j.spec.name, {i}); moved.ok())
        p = std::move(moved).value();
    TaskRecord t;
    t.job = j.spec.name;
    t.index = i;
    t.generation = j.generation;
    t.machine = p.machines[static_cast<size_t>(i)];
    t.id = weft::make_task_id(j.spec.name, i, ++seq_);
    t.since_us = now;
    launch(j, t, &out);
  }
  preempt_guests(now, &out);
  return out;
}

void Scheduler::preempt_guests(uint64_t now, std::vector<Command>* out) {
  for (const Eviction& e : alloc_.take_evictions()) {
    auto jit = jobs_.find(e.job);
    if (jit == jobs_.end()) continue;
    const uint64_t notice = jit->second.spec.batch.notice_us;
    for_job(e.job, [&](TaskRecord& t) {
      if (t.index != e.index || t.machine != e.machine || !task_live(t.state)) return;
      t.preempted = true;
      t.since_us = now;
      set_state(t, TaskState::kStopping);
      reported_changes_.insert(t.job);
      event(t, "taken back",
            "its machine's owner needs the room: " + std::to_string(notice / 1'000'000) +
                " s to finish, then it runs elsewhere");
      out->push_back(Command{
          Command::Kind::kStop, t.machine, t.id, {{"grace", static_cast<double>(notice) / 1e6}}});
    });
  }
}

void Scheduler::launch(const Job& j, TaskRecord t, std::vector<Command>* out) {
  t.entitlement = j.spec.entitlement_id;  // (a created job is in jobs_ only after this)
  // Its ports: the job's fixed ones, and those its index holds on this machine.
  t.ports.clear();
  auto dynamic = alloc_.dynamic_ports(j.spec.name, t.index);
  size_t k = 0;
  for (const auto& [name, port] : j.spec.ports)
    t.ports[name] = port ? port : k < dynamic.size() ? dynamic[k++] : 0;
  if (!ready_ || ready_(t.machine)) {
    t.state = TaskState::kStarting;  // a new record: put_task counts and marks it
    out->push_back(start_cmd(j, t));
  } else {
    t.state = TaskState::kPending;
  }
  event(t, "placed", alloc_.spec(t.machine).name);
  put_task(t);
}

std::vector<TaskEvent> Scheduler::take_events() {
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

std::vector<Command> Scheduler::machine_ready(MachineId m, uint64_t now) {
  std::vector<Command> out;
  if (machine_fenced(m)) return out;
  for_machine(m, [&](TaskRecord& t) {
    if (t.state != TaskState::kPending) return;
    auto jit = jobs_.find(t.job);
    if (jit == jobs_.end()) return;
    set_state(t, TaskState::kStarting);
    t.since_us = now;
    out.push_back(start_cmd(jit->second, t));
  });
  return out;
}

Result<std::vector<Command>> Scheduler::create(const JobSpec& spec, uint64_t now) {
  // The spec passed weft::parse_job_spec; these guard what the scheduler relies on.
  if (!weft::valid_job_name(spec.name)) return field_error("name", "is not a valid job name");
  if (spec.count < 1 || spec.count > kMaxTasksPerJob) return field_error("count", "out of range");
  if (spec.max_unavailable < 1) return field_error("max_unavailable", "must be at least 1");
  if (jobs_.count(spec.name)) return field_error("name", "job " + spec.name + " exists");
  if (fenced(spec.entitlement_id)) return moving_error();
  Job j;
  j.spec = spec;
  if (spec.is_batch()) j.progress.started_us = now;
  add_revision(j, now);
  auto cmds = converge(j, now);
  if (!cmds.ok()) return cmds.error();  // nothing placed, nothing recorded
  jobs_[spec.name] = j;
  changed_jobs_.insert(spec.name);
  return cmds;
}

int Scheduler::target_count(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.wanted();
}

Result<std::vector<Command>> Scheduler::scale(const std::string& name, int count, uint64_t now,
                                              bool through_controller) {
  auto it = jobs_.find(name);
  if (it == jobs_.end() || it->second.stopping)
    return field_error("job", "no such job " + name).with_code(rpc::kNotFound);
  if (job_fenced(name)) return moving_error();
  if (count < 1) return field_error("count", "must be at least 1 (stop the job instead)");
  Job& j = it->second;
  if (j.ended())
    return field_error("job", "batch job " + name + " has ended: " + j.progress.outcome);
  if (j.spec.is_batch() && count > j.spec.batch.completions)
    return field_error("count", "a batch job's parallelism is at most its completions (" +
                                    std::to_string(j.spec.batch.completions) + ")");
  if (j.spec.periodic) {  // the parallelism of its next runs
    j.spec.count = count;
    changed_jobs_.insert(name);
    return std::vector<Command>{};
  }
  if (through_controller && j.controlled() && count < j.spec.count) {
    j.shrink_to = count;  // its stops are pending operations now (pending_operations)
    std::vector<Command> out;
    finish_shrink(j, now, &out);  // nothing above it runs any more: at once
    return out;
  }
  j.shrink_to = 0;
  std::vector<Command> out;
  if (count < j.spec.count) {
    for_job(name, [&](TaskRecord& t) {
      if (t.index >= count && running_copy(t.state)) {
        set_state(t, TaskState::kStopping);
        t.since_us = now;
        out.push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
      }
    });
  }
  if (auto r = alloc_.resize(name, count); !r.ok()) {
    for_job(name, [&](TaskRecord& t) {  // nothing fits: nothing changes
      if (t.index >= count && t.state == TaskState::kStopping) set_state(t, TaskState::kRunning);
    });
    return r.error();
  }
  j.spec.count = count;
  changed_jobs_.insert(name);
  TRY_ASSIGN(auto more, converge(j, now));  // new indices get tasks; others are live
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

Result<std::vector<Command>> Scheduler::update(const JobSpec& spec, uint64_t now) {
  auto it = jobs_.find(spec.name);
  if (it == jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + spec.name).with_code(rpc::kNotFound);
  if (job_fenced(spec.name)) return moving_error();
  Job& j = it->second;
  if (j.spec.periodic || spec.periodic) {
    // A periodic job's spec is its next runs' (the runs under way keep theirs).
    if (!j.spec.periodic || !spec.periodic)
      return field_error("periodic", "a job becomes periodic, or stops being so, as a new job");
    if (spec.entitlement_id != j.spec.entitlement_id)
      return field_error("entitlement", "a job moves to another entitlement as a new job");
    j.spec = spec;
    ++j.generation;
    add_revision(j, now);
    changed_jobs_.insert(j.spec.name);
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
  changed_jobs_.insert(j.spec.name);
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
    for_job(j.spec.name, [&](TaskRecord& t) {
      if (task_live(t.state) && t.state != TaskState::kPending) j.prefetching.insert(t.machine);
    });
    j.prefetch_deadline_us = now + kPrefetchTimeoutUs;
    for (MachineId m : j.prefetching)
      prefetch.push_back(Command{Command::Kind::kPrefetch, m, j.spec.name,
                                 nlohmann::json{{"fetch", fetch}, {"generation", j.generation}}});
  }
  // Indices with nothing live (their start was refused, say) get the new spec at once;
  // the others roll, max_unavailable at a time.
  TRY_ASSIGN(auto out, converge(j, now));
  auto rolled = roll(j, now);
  out.insert(out.end(), rolled.begin(), rolled.end());
  out.insert(out.begin(), prefetch.begin(), prefetch.end());
  return out;
}

Status Scheduler::set_autoscale(const std::string& job, const std::optional<AutoscaleSpec>& a) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + job).with_code(rpc::kNotFound);
  if (job_fenced(job)) return moving_error();
  it->second.spec.autoscale = a;
  changed_jobs_.insert(job);
  return {};
}

std::vector<Command> Scheduler::prefetched(const std::string& job, uint64_t generation, MachineId m,
                                           uint64_t now) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.stopping || it->second.generation != generation ||
      job_fenced(job) || !it->second.prefetching.erase(m))
    return {};
  return roll(it->second, now);
}

std::vector<Command> Scheduler::roll(Job& j, uint64_t now) {
  std::vector<Command> out;
  if (j.spec.is_batch()) return out;  // batch jobs are not updated
  // Unavailable, whatever the reason (Twine §2.4): every index of the job with no task
  // running now: stopping for this update, starting, pending, lost, failed or draining.
  std::set<int> running_idx;
  std::vector<TaskRecord*> old;
  for_job(j.spec.name, [&](TaskRecord& t) {
    if (available(t)) running_idx.insert(t.index);
    if ((t.generation < j.generation || j.restarts.count(t.id)) && task_live(t.state))
      old.push_back(&t);
  });
  j.rolling = !old.empty();
  if (old.empty() && j.progress.canary) {  // every task has the new spec: nothing to hold
    j.progress.canary = false;
    changed_jobs_.insert(j.spec.name);
  }
  // An update's restarts (not an operator's restart of one task) as the rollout allows:
  // none while paused, the canaries in a canary phase.
  int allowed = update_restarts_allowed(j);
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
      set_state(*t, TaskState::kStopping);
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
    set_state(*t, TaskState::kStopping);
    t->since_us = now;
    out.push_back(Command{Command::Kind::kStop, t->machine, t->id, {}});
    ++in_flight;
  }
  return out;
}

Result<std::vector<Command>> Scheduler::stop(const std::string& name, uint64_t now) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return field_error("job", "no such job " + name).with_code(rpc::kNotFound);
  if (job_fenced(name)) return moving_error();
  std::vector<Command> out;
  if (it->second.spec.periodic) {  // its runs stop with it
    std::vector<std::string> runs;
    for (const auto& [run, j] : jobs_)
      if (j.progress.parent == name && !j.stopping) runs.push_back(run);
    for (const auto& run : runs)
      if (auto more = stop(run, now); more.ok()) out.insert(out.end(), more->begin(), more->end());
    it = jobs_.find(name);
  }
  it->second.stopping = true;
  changed_jobs_.insert(name);
  for_job(name, [&](TaskRecord& t) {
    if (!running_copy(t.state)) return;
    t.since_us = now;
    if (t.state == TaskState::kPending) {  // never sent: nothing to stop
      set_state(t, TaskState::kStopped);
      return;
    }
    set_state(t, TaskState::kStopping);
    out.push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
  });
  auto done = after_stopped(name, now);  // a job with nothing running ends here
  out.insert(out.end(), done.begin(), done.end());
  unwait_if([&](const std::string& id) {
    auto t = tasks_.find(id);
    return t == tasks_.end() || t->second.job == name;
  });
  return out;
}

void Scheduler::abandon(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  EntitlementId e = it->second.spec.entitlement_id;
  for (const auto& t : tasks_of(name)) erase_task(t.id);
  unwait_if([&](const std::string& id) { return !tasks_.count(id); });
  jobs_.erase(it);
  changed_jobs_.insert(name);
  alloc_.release(name);
  (void)alloc_.shrink(e);
}

void Scheduler::replace(const std::string& task_id, uint64_t now, std::vector<Command>* out,
                        bool prepaid) {
  TaskRecord old = tasks_.at(task_id);
  auto jit = jobs_.find(old.job);
  if (jit == jobs_.end() || jit->second.stopping || old.index >= jit->second.wanted() ||
      jit->second.ended())
    return;
  if (jit->second.spec.is_batch() &&
      jit->second.progress.failed > jit->second.spec.batch.max_failures)
    return;  // past its budget: the job fails (check_batch)
  if (!prepaid && !tokens_.take(now)) {
    wait(task_id);
    return;
  }
  auto p = alloc_.move_tasks(old.job, {old.index});
  if (!p.ok()) {  // no room now: try again at the next tick
    wait(task_id);
    return;
  }
  launch_copy(jit->second, old, p->machines[static_cast<size_t>(old.index)], now, out);
  preempt_guests(now, out);
  if (waiting_set_.erase(task_id))
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), task_id), waiting_.end());
}

void Scheduler::launch_copy(Job& j, const TaskRecord& old, MachineId machine, uint64_t now,
                            std::vector<Command>* out) {
  TaskRecord t;
  t.job = old.job;
  t.index = old.index;
  t.generation = j.generation;
  t.machine = machine;
  t.id = weft::make_task_id(old.job, old.index, ++seq_);
  t.since_us = now;
  if (old.generation == j.generation) {  // a new spec starts the count again
    t.setup_failures = old.setup_failures;
    t.setup_reason = old.setup_reason;
  }
  launch(j, t, out);
}

std::vector<Command> Scheduler::report(MachineId m, const std::map<std::string, TaskState>& rep,
                                       uint64_t now, std::vector<std::string>* forget) {
  return report_list(m, weft::TaskList(rep.begin(), rep.end()), now, forget);
}

void Scheduler::observe(MachineId m, const std::string& id, TaskState state, uint64_t now,
                        Observed* o, std::vector<std::string>* forget) {
  std::vector<Command>& out = o->out;
  auto it = tasks_.find(id);
  // The agent's states: the task exists (and may run again) unless it ended.
  bool running = weft::task_present_on_machine(state);
  if (it == tasks_.end() || it->second.machine != m ||
      (!running_copy(it->second.state) && it->second.state != TaskState::kStopping)) {
    // Not ours, replaced while this machine was away, or already ended: never twice.
    if (running)
      out.push_back(Command{Command::Kind::kStop, m, id, {}});
    else if (forget)
      forget->push_back(id);  // its end is on record (or it was never ours)
    return;
  }
  TaskRecord& t = it->second;
  if (running) {
    bool ready = state == TaskState::kReady;
    if (t.state == TaskState::kStarting || t.state == TaskState::kPending) {
      set_state(t, TaskState::kRunning);
      t.since_us = now;
      t.ready = false;
      reported_changes_.insert(t.job);
    }
    if (t.state == TaskState::kRunning && t.ready != ready) {
      // Available or not any more: what a rolling update, a drain and a controller count.
      t.ready = ready;
      event(t, ready ? "ready" : "not ready");
      reported_changes_.insert(t.job);
      service_changes_.insert(t.job);
      if (ready) {
        o->started.insert(t.job);
        stop_drained_sibling(t, now, &out);
      }
    } else if (t.state == TaskState::kStopping && now - t.since_us > kStartResendUs) {
      // Still running long after its stop was due: the stop was lost (the control
      // plane restarted between recording it and sending it). Send it again.
      t.since_us = now;
      out.push_back(Command{Command::Kind::kStop, m, id, {}});
    }
    return;
  }
  // The task ended.
  reported_changes_.insert(t.job);
  auto jit = jobs_.find(t.job);
  Job* batch = jit != jobs_.end() && jit->second.spec.is_batch() ? &jit->second : nullptr;
  if (t.preempted && t.state == TaskState::kStopping) {
    // A guest that left the room it was asked to give back: done if it finished in its
    // notice, else placed again elsewhere (not a failure: replace, not batch_task_ended).
    if (batch && state == TaskState::kExited) {
      set_state(t, TaskState::kExited);
      batch_task_ended(*batch, t, true);
    } else {
      set_state(t, TaskState::kStopped);
      o->replace_ids.push_back(id);
    }
    t.since_us = now;
    o->rolled.insert(t.job);
  } else if (t.state == TaskState::kStopping || t.state == TaskState::kDraining) {
    // A draining copy that ended is as good as stopped: its replacement is on its way.
    set_state(t, TaskState::kStopped);
    t.since_us = now;
    o->rolled.insert(t.job);
  } else if (batch && state == TaskState::kExited) {
    // A batch task that exited 0 is complete: not replaced.
    set_state(t, TaskState::kExited);
    t.since_us = now;
    batch_task_ended(*batch, t, true);
    o->rolled.insert(t.job);
  } else {
    set_state(t, TaskState::kFailed);
    t.since_us = now;
    const weft::TaskFailure* why = nullptr;
    if (o->failures)
      if (auto f = o->failures->find(id); f != o->failures->end()) why = &f->second;
    if (why) t.message = why->reason;
    if (why && why->setup) {
      if (t.setup_reason != why->reason) t.setup_failures = 0;
      t.setup_reason = why->reason;
      ++t.setup_failures;
    } else {
      t.setup_failures = 0;  // it ran: a failure of the program, replaced as ever
      t.setup_reason.clear();
    }
    if (t.setup_failures >= kSetupFailuresHeld) {
      // The same failure before the program ran, again and again (on whichever
      // machine): the spec cannot start. Held with the reason, as a refused spec is.
      t.held = true;
      t.message = "failed " + std::to_string(t.setup_failures) +
                  " times in a row before its program ran, held until the job's spec "
                  "changes: " +
                  why->reason;
      o->rolled.insert(t.job);  // a rolling update goes on past it
    } else {
      o->replace_ids.push_back(id);
    }
    if (batch) {
      batch_task_ended(*batch, t, false);
      o->rolled.insert(t.job);
    }
  }
  if (forget) forget->push_back(id);  // recorded (and persisted before the reply)
}

std::vector<Command> Scheduler::report_list(MachineId m, const weft::TaskList& rep, uint64_t now,
                                            std::vector<std::string>* forget,
                                            const weft::TaskFailures* failures,
                                            bool running_is_ready) {
  if (machine_fenced(m)) return {};
  Observed o;
  o.failures = failures;
  // The report and this machine's tasks are both in id order: one merge finds what the
  // machine reports that is not as recorded, and what it should run but did not report.
  // A running task reported running with the readiness on record needs nothing (observe
  // would change nothing), so a machine at rest costs a walk, not a lookup a task: with
  // 200 tasks a machine and a million in all, the lookups were most of the whole-list
  // check (issue 46's C1M profile).
  std::vector<std::pair<const std::string*, TaskState>> changed;
  std::vector<TaskRecord*> missing;
  LostNote lost;
  static const std::map<std::string, TaskRecord*> kNone;
  auto mt = machine_tasks_.find(m);
  const auto& mine = mt == machine_tasks_.end() ? kNone : mt->second;
  auto at = mine.begin();
  for (const auto& [id, reported] : rep) {
    TaskState state =
        running_is_ready && reported == TaskState::kRunning ? TaskState::kReady : reported;
    int order = 1;  // one comparison a step (ids share their job's prefix)
    while (at != mine.end() && (order = at->first.compare(id)) < 0) {
      missing.push_back((at++)->second);
      order = 1;
    }
    if (order == 0) {
      const TaskRecord& r = *(at++)->second;
      bool steady = r.state == TaskState::kRunning && weft::task_present_on_machine(state) &&
                    r.ready == (state == TaskState::kReady);
      if (steady) continue;
    }
    changed.emplace_back(&id, state);
  }
  while (at != mine.end()) missing.push_back((at++)->second);
  for (const auto& [id, state] : changed) observe(m, *id, state, now, &o, forget);
  // Tasks this machine should run but did not report.
  for (TaskRecord* missed : missing) {
    TaskRecord& t = *missed;
    if (t.state == TaskState::kStarting && now - t.since_us > kStartResendUs &&
        now - t.since_us <= kStartGraceUs) {
      if (auto jit = jobs_.find(t.job); jit != jobs_.end() && !jit->second.stopping)
        o.out.push_back(start_cmd(jit->second, t));
      continue;
    }
    if (t.state == TaskState::kRunning ||
        (t.state == TaskState::kStarting && now - t.since_us > kStartGraceUs)) {
      lost.add(t);
      set_state(t, TaskState::kLost);
      t.since_us = now;
      o.replace_ids.push_back(t.id);
    } else if (t.state == TaskState::kStopping || t.state == TaskState::kDraining) {
      set_state(t, TaskState::kStopped);  // gone is stopped
      t.since_us = now;
      o.rolled.insert(t.job);
    }
  }
  if (lost.count > 0)
    log_info("tasks lost: their machine's report lacks them",
             {{"MACHINE", std::to_string(m)},
              {"REPORTED", std::to_string(rep.size())},
              {"LOST", std::to_string(lost.count)},
              {"TASKS", lost.named}});
  return finish_report(o, now);
}

std::vector<Command> Scheduler::report_changes(MachineId m, const weft::TaskChanges& changes,
                                               uint64_t now, std::vector<std::string>* forget,
                                               const weft::TaskFailures* failures) {
  if (machine_fenced(m)) return {};
  Observed o;
  o.failures = failures;
  for (const auto& [id, state] : changes)
    if (state) observe(m, id, *state, now, &o, forget);
  return finish_report(o, now);
}

std::vector<Command> Scheduler::finish_report(Observed& o, uint64_t now) {
  std::vector<Command> out = std::move(o.out);
  for (const auto& id : o.replace_ids) replace(id, now, &out);
  for (const auto& id : o.replace_ids) reported_changes_.insert(tasks_.at(id).job);
  for (const auto& job : o.rolled) reported_changes_.insert(job);
  for (const auto& job : o.rolled) {
    auto more = after_stopped(job, now);
    out.insert(out.end(), more.begin(), more.end());
  }
  // A start frees no slot and adds no index: only an update in progress moves on (a
  // job's every start would otherwise walk the whole job).
  for (const auto& job : o.started) {
    if (o.rolled.count(job)) continue;
    if (auto jit = jobs_.find(job); jit != jobs_.end() && jit->second.rolling) {
      auto more = roll(jit->second, now);
      out.insert(out.end(), more.begin(), more.end());
    }
  }
  return out;
}

std::vector<Command> Scheduler::after_stopped(const std::string& name, uint64_t now) {
  std::vector<Command> out;
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return out;
  Job& j = it->second;
  if (j.spec.is_batch() && !j.stopping) check_batch(j, now, &out);
  bool any_live = false;
  for_job(name, [&](TaskRecord& t) {
    any_live = any_live || running_copy(t.state) || t.state == TaskState::kStopping;
  });
  if (j.ended() && !j.stopping) {
    // An ended batch job gives its slots back once nothing of it runs; it stays listed
    // with its outcome until it is stopped.
    if (!any_live && alloc_.request(name)) {
      alloc_.release(name);
      (void)alloc_.shrink(j.spec.entitlement_id);
      changed_jobs_.insert(name);
    }
    return out;
  }
  if (j.stopping) {
    if (!any_live) {  // every task stopped: the job and its resources go
      EntitlementId e = j.spec.entitlement_id;
      alloc_.release(name);
      jobs_.erase(it);
      changed_jobs_.insert(name);
      (void)alloc_.shrink(e);  // the entitlement gives its empty machines back (take_moved)
    }
    return out;
  }
  // A scale-down's stops are confirmed: machines it emptied go back too.
  (void)alloc_.shrink(j.spec.entitlement_id);
  // Rolling update or scale-down: start the new generation in freed slots, then roll on.
  auto more = converge(j, now);
  if (more.ok()) out.insert(out.end(), more->begin(), more->end());
  auto rolled = roll(j, now);
  out.insert(out.end(), rolled.begin(), rolled.end());
  return out;
}

std::vector<Command> Scheduler::start_refused(const std::string& task_id,
                                              const std::string& message, bool bad_spec,
                                              uint64_t now) {
  std::vector<Command> out;
  auto it = tasks_.find(task_id);
  if (it != tasks_.end() && job_fenced(it->second.job)) return out;
  // Only a start still awaited: a task that ran meanwhile (a resend refused as a
  // duplicate, say) or was stopped is not failed by a late reply.
  if (it == tasks_.end() || it->second.state != TaskState::kStarting) return out;
  TaskRecord& t = it->second;
  set_state(t, TaskState::kFailed);
  t.since_us = now;
  t.message = message;
  t.held = bad_spec;
  reported_changes_.insert(t.job);
  if (auto jit = jobs_.find(t.job); jit != jobs_.end() && jit->second.spec.is_batch())
    batch_task_ended(jit->second, t, false);
  if (!bad_spec) replace(task_id, now, &out);
  auto more = after_stopped(t.job, now);  // a rolling update goes on past a refused task
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<Command> Scheduler::machine_down(MachineId m, uint64_t now, bool prepaid) {
  std::vector<Command> out;
  if (machine_fenced(m)) return out;
  std::vector<std::string> lost;
  std::set<std::string> stopped_jobs;
  LostNote noted;
  for_machine(m, [&](TaskRecord& t) {
    if (task_live(t.state)) {
      noted.add(t);
      set_state(t, TaskState::kLost);
      t.since_us = now;
      lost.push_back(t.id);
    } else if (t.state == TaskState::kStopping || t.state == TaskState::kDraining) {
      set_state(t, TaskState::kStopped);  // a draining copy's replacement exists or waits
      t.since_us = now;
      stopped_jobs.insert(t.job);
    }
  });
  if (!lost.empty())
    log_info("tasks lost: their machine is down", {{"MACHINE", std::to_string(m)},
                                                   {"LOST", std::to_string(noted.count)},
                                                   {"TASKS", noted.named}});
  for (const auto& id : lost) replace(id, now, &out, prepaid);
  for (const auto& job : stopped_jobs) {
    auto more = after_stopped(job, now);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

std::vector<Command> Scheduler::machine_drain(MachineId m, uint64_t now) {
  std::vector<Command> out;
  if (machine_fenced(m)) return out;
  drained_.insert(m);
  std::vector<std::string> move;
  std::vector<std::pair<std::string, int>> slots;
  for_machine(m, [&](TaskRecord& t) {
    if (t.state == TaskState::kStopping) {
      // Being stopped for an update or a scale-down: what starts in its slot next must
      // not start here (it would wait for this machine forever).
      auto jit = jobs_.find(t.job);
      if (jit != jobs_.end() && !jit->second.stopping && t.index < jit->second.spec.count)
        slots.emplace_back(t.job, t.index);
      return;
    }
    if (t.state == TaskState::kPending) {  // never started: just place it elsewhere
      set_state(t, TaskState::kStopped);
      t.since_us = now;
      move.push_back(t.id);
    } else if (t.state == TaskState::kStarting || t.state == TaskState::kRunning) {
      if (auto jit = jobs_.find(t.job); jit != jobs_.end() && jit->second.controlled()) {
        jit->second.moves.insert(t.id);  // its controller says when (pending_operations)
        return;
      }
      set_state(t, TaskState::kDraining);
      t.since_us = now;
      move.push_back(t.id);
    }
  });
  for (const auto& id : move) replace(id, now, &out);
  for (const auto& [job, index] : slots) {
    auto placed = alloc_.placement(job);
    if (static_cast<size_t>(index) < placed.size() && placed[static_cast<size_t>(index)] == m)
      (void)alloc_.move_tasks(job, {index});  // no room: it waits for the machine
  }
  return out;
}

std::vector<Command> Scheduler::machine_unprepared(MachineId m, const std::string& why,
                                                   uint64_t now) {
  std::vector<Command> out;
  std::vector<std::string> waiting;
  for_machine(m, [&](TaskRecord& t) {
    if (t.state != TaskState::kPending) return;
    set_state(t, TaskState::kLost);
    t.since_us = now;
    t.message = why;
    reported_changes_.insert(t.job);
    waiting.push_back(t.id);
  });
  for (const auto& id : waiting) replace(id, now, &out);
  return out;
}

void Scheduler::machine_undrained(MachineId m) {
  drained_.erase(m);
  for_machine(m, [&](TaskRecord& t) {
    if (auto jit = jobs_.find(t.job); jit != jobs_.end()) jit->second.moves.erase(t.id);
  });
}

std::vector<Command> Scheduler::machine_evict(MachineId m, uint64_t now) {
  std::vector<Command> out;
  if (machine_fenced(m)) return out;
  std::vector<std::string> ids;
  for_machine(m, [&](TaskRecord& t) { ids.push_back(t.id); });
  for (const auto& id : ids) {
    TaskRecord& t = tasks_.at(id);
    auto jit = jobs_.find(t.job);
    if (t.state == TaskState::kPending) {  // never started: placed elsewhere
      set_state(t, TaskState::kStopped);
      t.since_us = now;
      replace(id, now, &out);
      continue;
    }
    if (t.state == TaskState::kStarting || t.state == TaskState::kRunning) {
      if (jit != jobs_.end()) jit->second.moves.erase(id);
      if (jit == jobs_.end() || !move_now(jit->second, id, now, &out)) continue;
    }
    if (t.state == TaskState::kDraining) {
      set_state(t, TaskState::kStopping);
      t.since_us = now;
      out.push_back(Command{Command::Kind::kStop, m, id, {}});
      reported_changes_.insert(t.job);
    }
  }
  return out;
}

bool Scheduler::move_now(Job& j, const std::string& id, uint64_t now, std::vector<Command>* out) {
  auto it = tasks_.find(id);
  if (it == tasks_.end() || !task_live(it->second.state) || it->second.state == TaskState::kPending)
    return false;
  TaskRecord& t = it->second;
  set_state(t, TaskState::kDraining);  // make before break: it stops once its copy runs
  t.since_us = now;
  j.in_progress[t.index] = "move/" + id;
  replace(id, now, out);
  return true;
}

Result<std::vector<Command>> Scheduler::move_task(const std::string& id, MachineId to,
                                                  const std::string& reason, uint64_t now) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return field_error("task", "no such task: " + id);
  TaskRecord& t = it->second;
  auto jit = jobs_.find(t.job);
  if (jit == jobs_.end() || jit->second.stopping)
    return field_error("task", "its job " + t.job + " is stopping");
  Job& j = jit->second;
  if (job_fenced(t.job)) return moving_error();
  if (!available(t)) return field_error("task", id + " is not running and ready");
  if (t.generation != j.generation || j.rolling)
    return field_error("task", "its job " + t.job + " is being updated");
  if (to >= alloc_.machine_count()) return field_error("machine", "no such machine");
  if (to == t.machine) return field_error("machine", "the task runs there already");
  if (alloc_.entitlement_of(to) != j.spec.entitlement_id)
    return field_error("machine", alloc_.spec(to).name + " is not in the job's entitlement");
  // Never more than max_unavailable of the job's indices unavailable, this move (its
  // task drains while its copy starts) and those asked of its controller counted: a
  // move never takes a job below count - max_unavailable ready tasks. Not while a
  // drain's moves or a shrink wait for its controller.
  if (!j.moves.empty() || j.shrink_to)
    return field_error("task", "its job " + t.job + " is being drained or shrunk");
  int ready = 0;
  for_job(t.job, [&](TaskRecord& o) { ready += available(o) && o.index < j.spec.count; });
  const int unavailable = j.spec.count - ready + static_cast<int>(j.retargets.size());
  if (unavailable + 1 > std::max(1, j.spec.max_unavailable))
    return field_error("task", "its job " + t.job + " has " + std::to_string(unavailable) +
                                   " tasks not ready or moving (max_unavailable " +
                                   std::to_string(j.spec.max_unavailable) + ")");
  if (!tokens_.take(now))
    return make_error("the destructive-operation budget is spent for now")
        .with_code(rpc::kUnavailable);
  std::vector<Command> out;
  event(t, "move asked", reason);
  if (j.controlled()) {
    j.retargets[id] = Job::Retarget{to, reason};  // its controller says when
    return out;
  }
  TRY(move_to(j, t, to, now, &out));
  return out;
}

Status Scheduler::move_to(Job& j, TaskRecord& t, MachineId to, uint64_t now,
                          std::vector<Command>* out) {
  TRY(alloc_.move_task_to(j.spec.name, t.index, to));
  set_state(t, TaskState::kDraining);  // make before break: it stops once its copy is ready
  t.since_us = now;
  reported_changes_.insert(t.job);
  if (j.spec.controller) j.in_progress[t.index] = "move/" + t.id;
  const TaskRecord old = t;
  launch_copy(j, old, to, now, out);
  return {};
}

Result<std::vector<Command>> Scheduler::restart_task(const std::string& id,
                                                     const std::string& reason, uint64_t now,
                                                     bool* waits) {
  *waits = false;
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return field_error("id", "no such task: " + id).with_code(rpc::kNotFound);
  TaskRecord& t = it->second;
  auto jit = jobs_.find(t.job);
  if (jit == jobs_.end() || jit->second.stopping)
    return field_error("id", "its job " + t.job + " is stopping");
  if (job_fenced(t.job)) return moving_error();
  if (t.state != TaskState::kRunning && t.state != TaskState::kStarting)
    return field_error("id", id + " is " + task_state_name(t.state) + ", not running")
        .with_code(rpc::kConflict);
  Job& j = jit->second;
  std::vector<Command> out;
  event(t, "restart asked", reason);
  if (j.controlled()) {
    j.restarts[id] = reason;  // its controller says when (pending_operations)
    *waits = true;
    return out;
  }
  set_state(t, TaskState::kStopping);  // its index starts again once it stopped
  t.since_us = now;
  reported_changes_.insert(t.job);
  out.push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
  return out;
}

Result<std::vector<Command>> Scheduler::liveness_failed(const std::string& id,
                                                        const std::string& why, uint64_t now,
                                                        bool* waits) {
  *waits = false;
  auto it = tasks_.find(id);
  if (it == tasks_.end())
    return field_error("task", "no such task: " + id).with_code(rpc::kNotFound);
  auto jit = jobs_.find(it->second.job);
  if (jit != jobs_.end() && jit->second.restarts.count(id)) {
    *waits = true;  // asked of its controller already
    return std::vector<Command>{};
  }
  if (it->second.state != TaskState::kRunning)
    return field_error("task", id + " is " + task_state_name(it->second.state) + ", not running")
        .with_code(rpc::kConflict);
  if (!tokens_.take(now))
    return make_error("the budget for destructive operations is spent: restarted later")
        .with_code(rpc::kUnavailable);
  return restart_task(id, "liveness: " + why, now, waits);
}

bool Scheduler::withdraw_move(const std::string& id) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return false;
  auto jit = jobs_.find(it->second.job);
  return jit != jobs_.end() && jit->second.retargets.erase(id) > 0;
}

bool Scheduler::moving(const std::string& id) const {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return false;
  if (it->second.state == TaskState::kDraining) return true;
  auto jit = jobs_.find(it->second.job);
  return jit != jobs_.end() && jit->second.retargets.count(id) > 0;
}

void Scheduler::stop_drained_sibling(const TaskRecord& t, uint64_t now, std::vector<Command>* out) {
  auto j = job_tasks_.find(t.job);
  if (j == job_tasks_.end()) return;
  for (auto it = j->second.lower_bound({t.index, std::string()});
       it != j->second.end() && it->first.first == t.index; ++it) {
    TaskRecord& other = *it->second;
    if (other.state != TaskState::kDraining || other.id == t.id) continue;
    set_state(other, TaskState::kStopping);
    other.since_us = now;
    out->push_back(Command{Command::Kind::kStop, other.machine, other.id, {}});
  }
}

std::optional<Scheduler::MovedJob> Scheduler::moved_job(const std::string& name) const {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return std::nullopt;
  const Job& j = it->second;
  return MovedJob{{j.spec, j.generation, j.stopping, j.progress},
                  j.granted,
                  j.moves,
                  j.in_progress,
                  j.fallback};
}

void Scheduler::adopt_job(const MovedJob& m, const std::vector<TaskRecord>& tasks) {
  const std::string& name = m.job.spec.name;
  forget_job(name);  // taken in again (a move resumed): what it was here goes
  restore_job(m.job);
  Job& j = jobs_.at(name);
  j.granted = m.granted;
  j.moves = m.moves;
  j.in_progress = m.in_progress;
  j.fallback = m.fallback;
  changed_jobs_.insert(name);
  for (const auto& t : tasks) put_task(t);
  queue_waits(&name);
}

void Scheduler::forget_job(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  for (const auto& t : tasks_of(name)) erase_task(t.id);
  unwait_if([&](const std::string& id) { return !tasks_.count(id); });
  jobs_.erase(it);
  changed_jobs_.insert(name);
  alloc_.release(name);
}

void Scheduler::finish_restore() {
  waiting_.clear();
  waiting_set_.clear();
  queue_waits(nullptr);
}

void Scheduler::queue_waits(const std::string* only) {
  std::map<std::pair<std::string, int>, const TaskRecord*> latest;  // by job and index
  std::set<std::pair<std::string, int>> running;
  auto each = [&](const TaskRecord& t) {
    auto key = std::pair{t.job, t.index};
    if (task_live(t.state)) running.insert(key);
    auto it = latest.find(key);
    if (it == latest.end() || it->second->since_us < t.since_us) latest[key] = &t;
  };
  if (only)
    for_job(*only, each);
  else
    for (const auto& [id, t] : tasks_) each(t);
  for (const auto& [key, t] : latest) {
    auto jit = jobs_.find(key.first);
    if (jit == jobs_.end() || jit->second.stopping || jit->second.ended() ||
        key.second >= jit->second.wanted() || running.count(key) || refused(*t, jit->second))
      continue;
    if (t->state == TaskState::kLost || t->state == TaskState::kFailed ||
        t->state == TaskState::kDraining)
      wait(t->id);
  }
}

std::vector<std::string> Scheduler::prune(uint64_t now, uint64_t retain_us, size_t budget) {
  std::vector<std::string> gone;
  size_t examined = 0, seen = 0, jobs = job_tasks_.size();
  auto it = job_tasks_.lower_bound(prune_cursor_);
  for (; seen < jobs && examined < budget; ++seen) {
    if (it == job_tasks_.end()) it = job_tasks_.begin();
    auto jit = jobs_.find(it->first);
    bool job_gone = jit == jobs_.end();
    const auto& ids = it->second;  // by (index, id)
    for (auto first = ids.begin(); first != ids.end();) {
      // The newest task of each index is kept, so a restart still knows what ran last.
      int index = first->first.first;
      auto end = first;
      const TaskRecord* newest = nullptr;
      for (; end != ids.end() && end->first.first == index; ++end, ++examined) {
        const TaskRecord& t = *end->second;
        if (!newest || newest->since_us < t.since_us) newest = &t;
      }
      for (auto c = first; c != end; ++c) {
        const TaskRecord& t = *c->second;
        bool ended = t.state == TaskState::kStopped || t.state == TaskState::kFailed ||
                     t.state == TaskState::kLost;
        if (!ended || waiting_set_.count(t.id)) continue;
        bool old = now > t.since_us && now - t.since_us >= retain_us;
        bool superseded = job_gone || index >= jit->second.spec.count || newest != &t;
        if (job_gone || (old && superseded)) gone.push_back(t.id);
      }
      first = end;
    }
    ++it;
    prune_cursor_ = it == job_tasks_.end() ? std::string() : it->first;
  }
  for (const auto& id : gone) erase_task(id);
  return gone;
}

void Scheduler::wait(const std::string& task_id) {
  if (waiting_set_.insert(task_id).second) waiting_.push_back(task_id);
}

std::vector<Command> Scheduler::tick(uint64_t now) {
  std::vector<Command> out;
  // Oldest first, while the budget lasts: what is left keeps its place in the queue.
  std::vector<std::string> waiting = std::exchange(waiting_, {});
  waiting_set_.clear();
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (!tokens_.peek(now)) {
      for (size_t j = i; j < waiting.size(); ++j) wait(waiting[j]);
      break;
    }
    auto t = tasks_.find(waiting[i]);
    if (t == tasks_.end()) continue;
    if (job_fenced(t->second.job))
      wait(waiting[i]);  // its entitlement is moving: it waits on, here or there
    else
      replace(waiting[i], now, &out);
  }
  auto_promote(now, &out);
  preempt_guests(now, &out);  // room taken back by any placement since
  // Batch jobs past their deadline fail; restored ones fill their free slots.
  for (auto& [name, j] : jobs_) {
    if (!j.spec.is_batch() || j.ended() || j.stopping || j.spec.periodic ||
        fenced(j.spec.entitlement_id))
      continue;
    if (j.spec.batch.deadline_us && now > j.progress.started_us &&
        now - j.progress.started_us > j.spec.batch.deadline_us) {
      end_batch(j, "failed",
                "its deadline (" + std::to_string(j.spec.batch.deadline_us / 1'000'000) +
                    " s) passed with " + std::to_string(j.progress.succeeded) + " of " +
                    std::to_string(j.spec.batch.completions) + " completions",
                now, &out);
      auto more = after_stopped(name, now);
      out.insert(out.end(), more.begin(), more.end());
    } else if (batch_idle_.erase(name)) {
      auto more = converge(j, now);
      if (more.ok()) out.insert(out.end(), more->begin(), more->end());
    }
  }
  batch_idle_.clear();
  // Updates whose prefetch deadline passed roll on without the machines still fetching.
  for (auto& [name, j] : jobs_) {
    if (j.prefetching.empty() || now < j.prefetch_deadline_us || j.stopping ||
        fenced(j.spec.entitlement_id))
      continue;
    auto rolled = roll(j, now);
    out.insert(out.end(), rolled.begin(), rolled.end());
  }
  return out;
}

}  // namespace weft::cp

namespace weft::cp {

std::vector<std::string> Scheduler::controlled_jobs() const {
  std::vector<std::string> out;
  for (const auto& [name, j] : jobs_)
    if (j.spec.controller && !j.stopping && !fenced(j.spec.entitlement_id)) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Scheduler::autoscaled_jobs() const {
  std::vector<std::string> out;
  for (const auto& [name, j] : jobs_)
    if (j.spec.autoscale && !j.stopping && !fenced(j.spec.entitlement_id)) out.push_back(name);
  return out;  // jobs_ is ordered by name
}

std::vector<Operation> Scheduler::pending_operations(const std::string& job) const {
  std::vector<Operation> out;
  auto it = jobs_.find(job);
  if (it == jobs_.end() || !it->second.spec.controller || it->second.stopping) return out;
  const Job& j = it->second;
  int allowed = update_restarts_allowed(j);  // paused or canaries: only those it may do
  if (auto jt = job_tasks_.find(job); jt != job_tasks_.end())
    for (const auto& [key, t] : jt->second)
      if (t->generation < j.generation && task_live(t->state) && allowed-- > 0)
        out.push_back(Operation{"restart/" + t->id, "restart", t->id, t->index,
                                "update to generation " + std::to_string(j.generation)});
  for (const auto& id : j.moves)
    if (auto t = tasks_.find(id); t != tasks_.end() && task_live(t->second.state))
      out.push_back(Operation{"move/" + id, "move", id, t->second.index, "its machine is drained"});
  for (const auto& [id, why] : j.restarts)
    if (auto t = tasks_.find(id);
        t != tasks_.end() && task_live(t->second.state) && t->second.generation == j.generation)
      out.push_back(Operation{"restart/" + id, "restart", id, t->second.index, why});
  for (const auto& [id, r] : j.retargets)
    if (auto t = tasks_.find(id);
        t != tasks_.end() && task_live(t->second.state) && !j.moves.count(id))
      out.push_back(Operation{"move/" + id, "move", id, t->second.index, r.reason});
  // A guest taken back: told, not asked (its notice runs whatever the controller says).
  if (j.spec.batch.opportunistic)
    if (auto jt = job_tasks_.find(job); jt != job_tasks_.end())
      for (const auto& [key, t] : jt->second)
        if (t->preempted && t->state == TaskState::kStopping)
          out.push_back(Operation{"preempt/" + t->id, "preempt", t->id, t->index,
                                  "its machine's owner took the room back: it stops within " +
                                      std::to_string(j.spec.batch.notice_us / 1'000'000) +
                                      " s (SIGTERM now, SIGKILL then) and runs again elsewhere"});
  if (j.shrink_to)
    if (auto jt = job_tasks_.find(job); jt != job_tasks_.end())
      for (const auto& [key, t] : jt->second)
        if (t->index >= j.shrink_to && running_copy(t->state))
          out.push_back(Operation{"stop/" + t->id, "stop", t->id, t->index,
                                  "scale down from " + std::to_string(j.spec.count) + " to " +
                                      std::to_string(j.shrink_to)});
  std::stable_sort(out.begin(), out.end(),
                   [](const Operation& a, const Operation& b) { return a.index < b.index; });
  return out;
}

std::vector<ControlledTask> Scheduler::controlled_tasks(const std::string& job) const {
  std::map<int, const TaskRecord*> newest;
  if (auto jt = job_tasks_.find(job); jt != job_tasks_.end())
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

std::vector<std::string> Scheduler::take_completed(const std::string& job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  Job& j = it->second;
  for (auto op = j.in_progress.begin(); op != j.in_progress.end();) {
    bool back = false;
    for_job(job, [&](TaskRecord& t) {
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

std::vector<Command> Scheduler::grant(const std::string& job, const std::vector<std::string>& ids,
                                      uint64_t now) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.stopping || job_fenced(job)) return {};
  Job& j = it->second;
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
      if (auto t = tasks_.find(id.substr(5)); t != tasks_.end() && running_copy(t->second.state)) {
        set_state(t->second, TaskState::kStopping);
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
        move_now(j, task, now, &out);
      } else if (auto r = j.retargets.find(task); r != j.retargets.end()) {
        MachineId to = r->second.to;
        j.retargets.erase(r);
        auto t = tasks_.find(task);
        // Where it was to go may not take it any more: the move is dropped.
        if (t != tasks_.end() && available(t->second))
          if (auto s = move_to(j, t->second, to, now, &out); !s.ok())
            log_info("a rebalancing move was dropped",
                     {{"TASK", task}, {"ERROR", s.error().str()}});
      }
      continue;
    }
    any |= j.granted.insert(id).second;
  }
  if (any) {
    auto rolled = roll(j, now);
    out.insert(out.end(), rolled.begin(), rolled.end());
  }
  if (stopped) finish_shrink(j, now, &out);
  return out;
}

void Scheduler::finish_shrink(Job& j, uint64_t now, std::vector<Command>* out) {
  if (!j.shrink_to) return;
  bool left = false;
  for_job(j.spec.name,
          [&](TaskRecord& t) { left |= t.index >= j.shrink_to && running_copy(t.state); });
  if (left && j.controlled()) return;  // more to consent to
  // None of the indices above runs (or the controller is out of the way): the count
  // follows, and what still runs there stops now.
  auto r = scale(j.spec.name, j.shrink_to, now);
  if (r.ok()) out->insert(out->end(), r->begin(), r->end());
}

std::vector<Command> Scheduler::set_control_fallback(const std::string& job, bool on,
                                                     uint64_t now) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.fallback == on || job_fenced(job)) return {};
  Job& j = it->second;
  j.fallback = on;
  j.granted.clear();    // an answer from before is not a permission for later
  j.retargets.clear();  // the ReBalancer's moves are not worth doing without consent
  // (An operator's restarts go on at max_unavailable pacing, as an update's do: roll.)
  if (!on || j.stopping) return {};
  // As for a job without a controller: drained machines' tasks move now, the update
  // rolls at max_unavailable pacing.
  std::vector<Command> out;
  for (const auto& id : std::exchange(j.moves, {})) move_now(j, id, now, &out);
  auto rolled = roll(j, now);
  out.insert(out.end(), rolled.begin(), rolled.end());
  finish_shrink(j, now, &out);
  return out;
}

bool Scheduler::control_fallback(const std::string& job) const {
  auto it = jobs_.find(job);
  return it != jobs_.end() && it->second.fallback;
}

}  // namespace weft::cp
