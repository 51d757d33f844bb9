#include "controlplane/scheduling/scheduler.h"

#include "common/log.h"
#include "common/rpc/protocol.h"

#include <algorithm>

namespace weft::cp {

namespace {
// A task that has not shown up in its machine's report this long after the start was
// sent is lost (the start command or the machine went missing).
constexpr uint64_t kStartGraceUs = 60'000'000;
// A start its machine has not reported after this long is sent again (the machine was
// offline when it was due, or the command was lost); the agent refuses a duplicate name.
constexpr uint64_t kStartResendUs = 5'000'000;
}  // namespace

Error moving_error() {
  return make_error(
             "its entitlement is moving to another shard: try again in a few seconds "
             "(weftctl entitlement show)")
      .with_code(rpc::kUnavailable);
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

Result<std::vector<Command>> Scheduler::create(const JobSpec& spec, uint64_t now) {
  // The spec passed weft::parse_job_spec; these guard what the scheduler relies on.
  if (!weft::valid_job_name(spec.name)) return field_error("name", "is not a valid job name");
  if (spec.count < 1 || spec.count > kMaxTasksPerJob) return field_error("count", "out of range");
  if (spec.max_unavailable < 1) return field_error("max_unavailable", "must be at least 1");
  if (jobs_.count(spec.name)) return field_error("name", "job " + spec.name + " exists");
  if (handover_.fenced(spec.entitlement_id)) return moving_error();
  JobRecord j;
  j.spec = spec;
  if (spec.is_batch()) j.progress.started_us = now;
  rollouts_.add_revision(j, now);
  auto cmds = placer_.converge(j, now);
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
  if (handover_.job_fenced(name)) return moving_error();
  if (count < 1) return field_error("count", "must be at least 1 (stop the job instead)");
  JobRecord& j = it->second;
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
    operations_.finish_shrink(j, now, &out);  // nothing above it runs any more: at once
    return out;
  }
  j.shrink_to = 0;
  std::vector<Command> out;
  if (count < j.spec.count) {
    table_.for_job(name, [&](TaskRecord& t) {
      if (t.index >= count && running_copy(t.state)) {
        table_.set_state(t, TaskState::kStopping);
        t.since_us = now;
        out.push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
      }
    });
  }
  if (auto r = alloc_.resize(name, count); !r.ok()) {
    table_.for_job(name, [&](TaskRecord& t) {  // nothing fits: nothing changes
      if (t.index >= count && t.state == TaskState::kStopping)
        table_.set_state(t, TaskState::kRunning);
    });
    return r.error();
  }
  j.spec.count = count;
  changed_jobs_.insert(name);
  TRY_ASSIGN(auto more, placer_.converge(j, now));  // new indices get tasks; others are live
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

Status Scheduler::set_autoscale(const std::string& job, const std::optional<AutoscaleSpec>& a) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.stopping)
    return field_error("name", "no such job " + job).with_code(rpc::kNotFound);
  if (handover_.job_fenced(job)) return moving_error();
  it->second.spec.autoscale = a;
  changed_jobs_.insert(job);
  return {};
}

Result<std::vector<Command>> Scheduler::stop(const std::string& name, uint64_t now) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return field_error("job", "no such job " + name).with_code(rpc::kNotFound);
  if (handover_.job_fenced(name)) return moving_error();
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
  table_.for_job(name, [&](TaskRecord& t) {
    if (!running_copy(t.state)) return;
    t.since_us = now;
    if (t.state == TaskState::kPending) {  // never sent: nothing to stop
      table_.set_state(t, TaskState::kStopped);
      return;
    }
    table_.set_state(t, TaskState::kStopping);
    out.push_back(Command{Command::Kind::kStop, t.machine, t.id, {}});
  });
  auto done = after_stopped(name, now);  // a job with nothing running ends here
  out.insert(out.end(), done.begin(), done.end());
  replacement_.unwait_if([&](const std::string& id) {
    auto t = table_.find(id);
    return t == table_.end() || t->second.job == name;
  });
  return out;
}

void Scheduler::abandon(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  EntitlementId e = it->second.spec.entitlement_id;
  for (const auto& t : table_.of_job(name)) table_.erase(t.id);
  replacement_.unwait_if([&](const std::string& id) { return !table_.count(id); });
  jobs_.erase(it);
  changed_jobs_.insert(name);
  alloc_.release(name);
  (void)alloc_.shrink(e);
}

std::vector<Command> Scheduler::report(MachineId m, const std::map<std::string, TaskState>& rep,
                                       uint64_t now, std::vector<std::string>* forget) {
  return report_list(m, weft::TaskList(rep.begin(), rep.end()), now, forget);
}

void Scheduler::observe(MachineId m, const std::string& id, TaskState state, uint64_t now,
                        Observed* o, std::vector<std::string>* forget) {
  std::vector<Command>& out = o->out;
  auto it = table_.find(id);
  // The agent's states: the task exists (and may run again) unless it ended.
  bool running = weft::task_present_on_machine(state);
  if (it == table_.end() || it->second.machine != m ||
      (!running_copy(it->second.state) && it->second.state != TaskState::kStopping)) {
    // Not ours, replaced while this machine was away, or already ended: never twice.
    if (running) {
      out.push_back(Command{Command::Kind::kStop, m, id, {}});
    } else {
      if (it != table_.end() && it->second.machine == m) replacement_.copy_ended(id);
      if (forget) forget->push_back(id);  // its end is on record (or it was never ours)
    }
    return;
  }
  TaskRecord& t = it->second;
  if (running) {
    bool ready = state == TaskState::kReady;
    if (t.state == TaskState::kStarting || t.state == TaskState::kPending) {
      table_.set_state(t, TaskState::kRunning);
      t.since_us = now;
      t.ready = false;
      reported_changes_.insert(t.job);
    }
    if (t.state == TaskState::kRunning && t.ready != ready) {
      // Available or not any more: what a rolling update, a drain and a controller count.
      t.ready = ready;
      table_.event(t, ready ? "ready" : "not ready");
      reported_changes_.insert(t.job);
      table_.service_changed(t.job);
      if (ready) {
        o->started.insert(t.job);
        moves_.stop_drained_sibling(t, now, &out);
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
  JobRecord* batch = jit != jobs_.end() && jit->second.spec.is_batch() ? &jit->second : nullptr;
  if (t.preempted && t.state == TaskState::kStopping) {
    // A guest that left the room it was asked to give back: done if it finished in its
    // notice, else placed again elsewhere (not a failure: replace, not batch_task_ended).
    if (batch && state == TaskState::kExited) {
      table_.set_state(t, TaskState::kExited);
      batch_.task_ended(*batch, t, true);
    } else {
      table_.set_state(t, TaskState::kStopped);
      o->replace_ids.push_back(id);
    }
    t.since_us = now;
    o->rolled.insert(t.job);
  } else if (t.state == TaskState::kStopping || t.state == TaskState::kDraining) {
    // A draining copy that ended is as good as stopped: its replacement is on its way.
    table_.set_state(t, TaskState::kStopped);
    t.since_us = now;
    o->rolled.insert(t.job);
  } else if (batch && state == TaskState::kExited) {
    // A batch task that exited 0 is complete: not replaced.
    table_.set_state(t, TaskState::kExited);
    t.since_us = now;
    batch_.task_ended(*batch, t, true);
    o->rolled.insert(t.job);
  } else {
    table_.set_state(t, TaskState::kFailed);
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
      batch_.task_ended(*batch, t, false);
      o->rolled.insert(t.job);
    }
  }
  if (forget) forget->push_back(id);  // recorded (and persisted before the reply)
}

std::vector<Command> Scheduler::report_list(MachineId m, const weft::TaskList& rep, uint64_t now,
                                            std::vector<std::string>* forget,
                                            const weft::TaskFailures* failures,
                                            bool running_is_ready) {
  if (handover_.machine_fenced(m)) return {};
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
  auto mt = table_.by_machine().find(m);
  const auto& mine = mt == table_.by_machine().end() ? kNone : mt->second;
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
    if (t.state == TaskState::kLost) replacement_.copy_ended(t.id);  // not there: it ended
    if (t.state == TaskState::kStarting && now - t.since_us > kStartResendUs &&
        now - t.since_us <= kStartGraceUs) {
      if (auto jit = jobs_.find(t.job); jit != jobs_.end() && !jit->second.stopping)
        o.out.push_back(placer_.start_cmd(jit->second, t));
      continue;
    }
    if (t.state == TaskState::kRunning ||
        (t.state == TaskState::kStarting && now - t.since_us > kStartGraceUs)) {
      lost.add(t);
      table_.set_state(t, TaskState::kLost);
      t.since_us = now;
      o.replace_ids.push_back(t.id);
    } else if (t.state == TaskState::kStopping || t.state == TaskState::kDraining) {
      table_.set_state(t, TaskState::kStopped);  // gone is stopped
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
  if (handover_.machine_fenced(m)) return {};
  Observed o;
  o.failures = failures;
  for (const auto& [id, state] : changes)
    if (state) observe(m, id, *state, now, &o, forget);
  return finish_report(o, now);
}

std::vector<Command> Scheduler::finish_report(Observed& o, uint64_t now) {
  std::vector<Command> out = std::move(o.out);
  for (const auto& id : o.replace_ids) replacement_.replace(id, now, &out);
  for (const auto& id : o.replace_ids) reported_changes_.insert(table_.at(id).job);
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
      auto more = rollouts_.roll(jit->second, now);
      out.insert(out.end(), more.begin(), more.end());
    }
  }
  return out;
}

std::vector<Command> Scheduler::after_stopped(const std::string& name, uint64_t now) {
  std::vector<Command> out;
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return out;
  JobRecord& j = it->second;
  if (j.spec.is_batch() && !j.stopping) batch_.check(j, now, &out);
  bool any_live = false;
  table_.for_job(name, [&](TaskRecord& t) {
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
  auto more = placer_.converge(j, now);
  if (more.ok()) out.insert(out.end(), more->begin(), more->end());
  auto rolled = rollouts_.roll(j, now);
  out.insert(out.end(), rolled.begin(), rolled.end());
  return out;
}

std::vector<Command> Scheduler::start_refused(const std::string& task_id,
                                              const std::string& message, bool bad_spec,
                                              uint64_t now) {
  std::vector<Command> out;
  auto it = table_.find(task_id);
  if (it != table_.end() && handover_.job_fenced(it->second.job)) return out;
  // Only a start still awaited: a task that ran meanwhile (a resend refused as a
  // duplicate, say) or was stopped is not failed by a late reply.
  if (it == table_.end() || it->second.state != TaskState::kStarting) return out;
  TaskRecord& t = it->second;
  table_.set_state(t, TaskState::kFailed);
  t.since_us = now;
  t.message = message;
  t.held = bad_spec;
  reported_changes_.insert(t.job);
  if (auto jit = jobs_.find(t.job); jit != jobs_.end() && jit->second.spec.is_batch())
    batch_.task_ended(jit->second, t, false);
  if (!bad_spec) replacement_.replace(task_id, now, &out);
  auto more = after_stopped(t.job, now);  // a rolling update goes on past a refused task
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<std::string> Scheduler::prune(uint64_t now, uint64_t retain_us, size_t budget) {
  std::vector<std::string> gone;
  size_t examined = 0, seen = 0, jobs = table_.by_job().size();
  auto it = table_.by_job().lower_bound(prune_cursor_);
  for (; seen < jobs && examined < budget; ++seen) {
    if (it == table_.by_job().end()) it = table_.by_job().begin();
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
        if (!ended || replacement_.waiting_set_.count(t.id)) continue;
        bool old = now > t.since_us && now - t.since_us >= retain_us;
        bool superseded = job_gone || index >= jit->second.spec.count || newest != &t;
        if (job_gone || (old && superseded)) gone.push_back(t.id);
      }
      first = end;
    }
    ++it;
    prune_cursor_ = it == table_.by_job().end() ? std::string() : it->first;
  }
  for (const auto& id : gone) table_.erase(id);
  return gone;
}

std::vector<Command> Scheduler::tick(uint64_t now) {
  std::vector<Command> out;
  replacement_.retry(now, &out);
  rollouts_.auto_promote(now, &out);
  placer_.preempt_guests(now, &out);  // room taken back by any placement since
  batch_.tick(now, &out);
  rollouts_.roll_unfetched(now, &out);
  return out;
}

std::vector<std::string> Scheduler::autoscaled_jobs() const {
  std::vector<std::string> out;
  for (const auto& [name, j] : jobs_)
    if (j.spec.autoscale && !j.stopping && !handover_.fenced(j.spec.entitlement_id))
      out.push_back(name);
  return out;  // jobs_ is ordered by name
}

}  // namespace weft::cp
