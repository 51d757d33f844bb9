#include "agent/task_checks.h"

#include "agent/init/argv.h"
#include "common/log.h"

namespace weft::agent {

void TaskChecks::start(Task& t) {
  stop(t);
  start_liveness(t);
  if (!t.spec.readiness) return set_ready(t, true);  // no check: ready once running
  schedule_check(t, t.spec.readiness->initial_delay_us);
}

void TaskChecks::stop(Task& t) {
  bool exec_running = t.check && t.spec.readiness && t.spec.readiness->kind == ReadinessKind::kExec;
  t.check.reset();
  if (exec_running) cgroups_.end_check(t.id);
  t.check_timer.reset();
  t.check_passes = t.check_failures = 0;
  t.check_detail.clear();
  t.ready = false;  // what is not running is not ready; reported with the new state
  stop_liveness(t);
}

Result<CheckTarget> TaskChecks::target(Task& t, const ReadinessCheck& check, bool liveness) {
  CheckTarget target;
  target.pid = t.pid;
  target.pidfd = t.pidfd.get();
  target.own_network = t.spec.ns.own_network();
  if (check.kind == ReadinessKind::kExec) {
    // The check's detail when it cannot run: the identity's message, the cgroup's whole error.
    auto ident = t.identity ? Result<Identity>(*t.identity) : hooks_.identity(t);
    if (!ident.ok()) return make_error(ident.error().message);
    target.init_path = init_path_;
    auto dir = cgroups_.check_dir(t.id, liveness);
    if (!dir.ok()) return make_error(dir.error().str());
    target.cgroup_dir = *dir;
    target.join_argv = init_argv(t.spec, *ident, InitJoin{t.pid, check.command});
  }
  return target;
}

// ---------------------------------------------------------------- liveness

void TaskChecks::start_liveness(Task& t) {
  stop_liveness(t);
  if (!t.spec.liveness) return;
  std::string id = t.id;
  auto timer =
      loop_.add_timer_in(t.spec.liveness->initial_delay_us, [this, id] { run_liveness(id); });
  if (timer.ok()) t.live.timer = std::move(timer).value();
}

void TaskChecks::stop_liveness(Task& t) {
  bool exec_running =
      t.live.run && t.spec.liveness && t.spec.liveness->kind == ReadinessKind::kExec;
  t.live.run.reset();
  if (exec_running) cgroups_.end_check(t.id, true);
  t.live.timer.reset();
  t.live.passes = t.live.failures = 0;
  t.live.detail.clear();
}

void TaskChecks::run_liveness(const std::string& id) {
  Task* tp = hooks_.find(id);
  if (!tp || tp->state != TaskState::kRunning || !tp->spec.liveness || tp->kill_sent) return;
  Task& t = *tp;
  t.live.timer.reset();
  auto to = target(t, *t.spec.liveness, true);
  if (!to.ok()) return on_liveness(id, false, to.error().message);
  t.live.run = start_check(
      loop_, http_, reaper_, *t.spec.liveness, *to,
      [this, id](bool passed, std::string detail) { on_liveness(id, passed, std::move(detail)); });
}

void TaskChecks::on_liveness(const std::string& id, bool passed, std::string detail) {
  Task* tp = hooks_.find(id);
  if (!tp) return;
  Task& t = *tp;
  t.live.run.reset();
  if (t.spec.liveness && t.spec.liveness->kind == ReadinessKind::kExec)
    cgroups_.end_check(t.id, true);
  if (t.state != TaskState::kRunning || !t.spec.liveness) return;
  const ReadinessCheck& c = *t.spec.liveness;
  if (passed) {
    ++t.live.passes;
    t.live.failures = 0;
    t.live.detail.clear();
  } else {
    ++t.live.failures;
    t.live.passes = 0;
    t.live.detail = std::move(detail);
    // Every failure_threshold failures in a row: a control plane that did not hear it
    // (no session then, or its budget for restarts spent) hears it again.
    if (t.live.failures % c.failure_threshold == 0) not_live(t);
  }
  // A task this agent is killing is ending: no more checks (they could only fail to
  // enter it, and its reason is the decision's, not theirs).
  if (t.state != TaskState::kRunning || t.kill_sent) return;
  std::string tid = t.id;
  auto timer = loop_.add_timer_in(c.interval_us, [this, tid] { run_liveness(tid); });
  if (timer.ok()) t.live.timer = std::move(timer).value();
}

void TaskChecks::not_live(Task& t) {
  std::string why = std::to_string(t.live.failures) +
                    " liveness checks failed in a row, the last: " + t.live.detail;
  log_warn("task not live: restarting it",
           {{"TASK_ID", t.id}, {"TASK_NAME", t.name}, {"REASON", why}});
  if (t.spec.owner == "controlplane") {
    // The control plane restarts it (its TaskController asked first); without a session
    // it waits for one (the next failures say it again).
    if (!hooks_.unhealthy(t, why))
      log_warn("no control plane to restart a task that is not live", {{"TASK_ID", t.id}});
    return;
  }
  // A local task: killed; its restart policy decides what follows. Its checks end
  // here: the reason is this decision's.
  if (t.kill_sent) return;
  t.killed_for = why;
  t.kill_sent = true;
  stop_liveness(t);
  if (auto s = cgroups_.kill_task(t.id); !s.ok())
    log_error("cannot kill a task that is not live",
              {{"TASK_ID", t.id}, {"ERROR", s.error().str()}});
}

// ---------------------------------------------------------------- readiness

void TaskChecks::schedule_check(Task& t, uint64_t after_us) {
  std::string id = t.id;
  auto timer = loop_.add_timer_in(after_us, [this, id] { run_check(id); });
  if (timer.ok())
    t.check_timer = std::move(timer).value();
  else
    log_error("cannot schedule a readiness check", {{"TASK_ID", id}});
}

void TaskChecks::run_check(const std::string& id) {
  Task* tp = hooks_.find(id);
  if (!tp || tp->state != TaskState::kRunning || !tp->spec.readiness) return;
  Task& t = *tp;
  t.check_timer.reset();
  auto to = target(t, *t.spec.readiness, false);
  if (!to.ok()) return on_check(id, false, to.error().message);
  t.check = start_check(
      loop_, http_, reaper_, *t.spec.readiness, *to,
      [this, id](bool passed, std::string detail) { on_check(id, passed, std::move(detail)); });
}

void TaskChecks::on_check(const std::string& id, bool passed, std::string detail) {
  Task* tp = hooks_.find(id);
  if (!tp) return;
  Task& t = *tp;
  t.check.reset();
  // Whatever the check's command started goes with it (killed at a timeout, or left
  // behind by a command that exited).
  if (t.spec.readiness && t.spec.readiness->kind == ReadinessKind::kExec) cgroups_.end_check(t.id);
  if (t.state != TaskState::kRunning || !t.spec.readiness) return;
  const ReadinessCheck& c = *t.spec.readiness;
  if (passed) {
    ++t.check_passes;
    t.check_failures = 0;
    t.check_detail.clear();
    if (t.check_passes >= c.success_threshold) set_ready(t, true);
  } else {
    ++t.check_failures;
    t.check_passes = 0;
    t.check_detail = std::move(detail);
    if (t.check_failures >= c.failure_threshold && t.ready) {
      log_warn("task not ready: readiness check failing",
               {{"TASK_ID", t.id}, {"TASK_NAME", t.name}, {"REASON", t.check_detail}});
      set_ready(t, false);
    }
  }
  schedule_check(t, c.interval_us);
}

void TaskChecks::set_ready(Task& t, bool ready) {
  if (t.ready == ready) return;
  t.ready = ready;
  if (ready && t.spec.readiness) log_info("task ready", {{"TASK_ID", t.id}, {"TASK_NAME", t.name}});
  hooks_.readiness_changed(t);
}

}  // namespace weft::agent
