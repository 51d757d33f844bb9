#include "agent/cp_calls.h"

#include "agent/manager.h"
#include "common/fs.h"
#include "common/log.h"

namespace weft::agent {

using json = nlohmann::json;

// The calls the control plane's session makes of this agent (cp_methods_), and the parts
// only they use (exec sessions, the local discovery copy).
Status CpCalls::add_cp_methods() {
  // The control plane's commands reach the task logic directly; the session was
  // authenticated when it connected (check_control_plane_peer).
  // A region's shard names itself and its epoch (HolderFence): a command from one
  // this machine left is refused.
  cp_methods_.add("task.run",
                  [this](const nlohmann::json& p, const rpc::CallContext&) -> Result<json> {
                    TRY_ASSIGN(json params, cp_->admit(p, "task.run"));
                    return m_.api_.run_task(std::move(params), /*for_control_plane=*/true);
                  });
  cp_methods_.add("task.stop",
                  [this](const nlohmann::json& p, const rpc::CallContext&) -> Result<json> {
                    TRY_ASSIGN(json params, cp_->admit(p, "task.stop"));
                    return m_.api_.stop_task(params);
                  });
  // `weftctl task logs` from anywhere: the control plane reads its own tasks' output
  // (by the name it gave them; never an operator's local task), the caller's
  // permission checked and audited there.
  cp_methods_.add("task.logs", [this](const nlohmann::json& p, const rpc::CallContext& c) {
    return m_.api_.cp_task_logs(p, c);
  });
  // One task's detail and a signal to it, for `weftctl task show|signal|kill` through
  // the control plane (which checked the caller; it hides secrets from viewers).
  cp_methods_.add("task.show", [this](const nlohmann::json& p, const rpc::CallContext&) {
    return m_.api_.cp_task_show(p);
  });
  cp_methods_.add("task.kill",
                  [this](const nlohmann::json& p, const rpc::CallContext& c) -> Result<json> {
                    TRY_ASSIGN(json params, cp_->admit(p, "task.kill"));
                    return m_.api_.cp_task_kill(params, c);
                  });
  // `weftctl task exec` (the control plane checked and audited the caller).
  execs_ = std::make_unique<ExecSessions>(
      *m_.loop_, *m_.reaper_,
      [this](const std::string& id, uint64_t n) { return m_.cgroups_->end_exec(id, n); });
  cp_methods_.add("task.exec",
                  [this](const nlohmann::json& p, const rpc::CallContext& c) -> Result<json> {
                    TRY_ASSIGN(json params, cp_->admit(p, "task.exec"));
                    return m_.api_.cp_exec(params, c);
                  });
  cp_methods_.add("task.exec.input", [this](const nlohmann::json& p, const rpc::CallContext& c) {
    execs_->input(c.session, p);
    return Result<json>(json::object());
  });
  // Autoscaling's figures (and an operator's, through the control plane).
  cp_methods_.add("task.usage", [this](const nlohmann::json& p, const rpc::CallContext& c) {
    return m_.api_.task_usage(p, c, /*control_plane_only=*/true);
  });
  // A rolling update to a new image asks for it before it stops the old tasks here.
  cp_methods_.add("image.pull",
                  [this](const nlohmann::json& p, const rpc::CallContext& c) -> Result<json> {
                    TRY_ASSIGN(json params, cp_->admit(p, "image.pull"));
                    return m_.fetching_.image_calls_->pull(params, c);
                  });
  // What the control plane says of a quiet heartbeat (a notification each).
  cp_methods_.add("report.resend", [this](const nlohmann::json&, const rpc::CallContext&) {
    if (cp_) cp_->resend();
    return Result<json>(json::object());
  });
  cp_methods_.add("report.forget", [this](const nlohmann::json& p, const rpc::CallContext&) {
    if (cp_) cp_->forget(p);
    return Result<json>(json::object());
  });
  // Service discovery: the endpoints this agent answers DNS from, in order; the answer
  // is the acknowledgement a stop elsewhere waits for.
  TRY_ASSIGN(discovery_,
             LocalDiscovery::start(
                 *m_.loop_, m_.cfg_,
                 [this](const std::vector<std::string>& jobs,
                        const std::vector<std::string>& forget, ServiceInterest::Reply reply) {
                   return cp_ && cp_->ask_services(jobs, forget, std::move(reply));
                 }));
  cp_methods_.add("service.update",
                  [this](const nlohmann::json& p, const rpc::CallContext&) -> Result<json> {
                    return discovery_->update(p);
                  });
  return {};
}

Status CpCalls::cp_start() {
  CpSession::Hooks hooks;
  hooks.tasks = [this] {
    std::map<std::string, ReportedTask> out;
    for (const auto& [id, t] : m_.tasks_) {
      if (t->spec.owner != "controlplane") continue;
      ReportedTask& r = out[t->spec.name];
      r.state = task_state_name(t->state == TaskState::kRunning && t->ready ? TaskState::kReady
                                                                            : t->state);
      // A fenced task's end is a failure to the control plane, with the reason why.
      r.failed = t->state == TaskState::kFailed ||
                 (t->terminal() && t->reason.find(kFencedReason) != std::string::npos);
      r.reason = t->reason;
      r.setup_failed = t->setup_failed;
    }
    return out;
  };
  hooks.forget = [this](const std::set<std::string>& names) { forget_ended(names); };
  hooks.task_ports = [this] {
    std::set<uint16_t> held;
    for (const auto& [id, t] : m_.tasks_)
      if (task_present_on_machine(t->state))
        for (const auto& [name, port] : t->spec.ports) held.insert(port);
    return held;
  };
  if (discovery_ && discovery_->interest())
    hooks.discovery_interest = [this] {
      return discovery_->interest().value_or(std::vector<std::string>{});
    };
  hooks.lease_terms = [this](const json& reply) { lease_terms(reply); };
  hooks.renewed = [this](uint64_t sent) { lease_renewed(sent); };
  // While tasks that the lease fences run here, every heartbeat asks for an answer.
  hooks.needs_lease = [this] {
    for (const auto& [id, t] : m_.tasks_)
      if (fenceable(*t)) return true;
    return false;
  };
  recover_lease();
  bool answers_dns = discovery_ && discovery_->answers_dns();
  TRY_ASSIGN(cp_,
             CpSession::start(*m_.loop_, m_.cfg_, &cp_methods_, answers_dns, std::move(hooks)));
  return {};
}

void CpCalls::forget_ended(const std::set<std::string>& wanted) {
  // The control plane has recorded these tasks' ends: drop them (row, state directory,
  // logs) so that neither reports nor the agent's own state grow with every task ever run.
  std::vector<std::string> ids;
  for (const auto& [id, t] : m_.tasks_)
    if (t->spec.owner == "controlplane" && t->terminal() && wanted.count(t->spec.name))
      ids.push_back(id);
  for (const auto& id : ids) {
    if (auto s = m_.erase(id); !s.ok()) {
      log_warn("cannot forget an ended task", {{"TASK_ID", id}, {"ERROR", s.error().str()}});
      continue;
    }
    const Task& t = *m_.tasks_.at(id);
    m_.dirs_.keep_logs(id, t.spec.name, task_state_name(t.state));
    m_.dirs_.remove(id);
    m_.tasks_.erase(id);
  }
}

}  // namespace weft::agent

namespace weft::agent {

bool CpCalls::fenceable(const Task& t) {
  return t.spec.owner == "controlplane" && t.spec.at_most_one && !t.terminal();
}

void CpCalls::lease_terms(const json& reply) {
  if (auto s = lease_.set_terms(reply); !s.ok())
    log_warn("the control plane's lease terms are refused; the previous ones stay",
             {{"ERROR", s.error().str()}});
}

void CpCalls::lease_renewed(uint64_t sent) {
  if (!lease_.has_terms()) return;
  lease_.renewed(sent);
  if (std::exchange(fenced_logged_, false))
    log_info(
        "the control plane answers again: the machine's lease is renewed; what was fenced "
        "stays stopped");
  // Not synced: it must outlive this process, not the machine (a reboot ends every task).
  if (!m_.boot_.id.empty())
    if (auto s = write_file(m_.cfg_.state_dir + "/lease", lease_.to_text(m_.boot_.id)); !s.ok())
      log_warn("cannot keep the machine's lease in the state directory",
               {{"ERROR", s.error().str()}});
  arm_fence();
}

void CpCalls::recover_lease() {
  auto text = read_file(m_.cfg_.state_dir + "/lease");
  std::optional<MachineLease> kept;
  if (text.ok()) kept = MachineLease::from_text(*text, m_.boot_.id);
  if (kept) {
    lease_ = *kept;
    arm_fence();  // at once if it ran out while this agent was away
    return;
  }
  // No lease kept for this boot (none was ever granted, or the file is unreadable): what
  // the lease fences here cannot know when it ends, so it stops now.
  bool any = false;
  for (const auto& [id, t] : m_.tasks_) any |= fenceable(*t);
  if (any) fence_now();
}

void CpCalls::arm_fence() {
  fence_timer_.reset();
  if (!lease_.has_terms()) return;
  uint64_t now = now_monotonic_us(), at = lease_.fence_at();
  auto t = m_.loop_->add_timer_in(at > now ? at - now : 0, [this] {
    fence_timer_.reset();
    fence_now();
  });
  if (t.ok()) fence_timer_ = std::move(t).value();
}

void CpCalls::fence_now() {
  uint64_t now = now_monotonic_us();
  bool known = lease_.has_terms();
  if (known && !lease_.fenced(now)) {
    arm_fence();  // renewed meanwhile
    return;
  }
  std::vector<Task*> fence;
  for (const auto& [id, t] : m_.tasks_)
    if (fenceable(*t)) fence.push_back(t.get());
  std::string why =
      known
          ? "no answer from the control plane for " +
                std::to_string((now - lease_.renewed_from()) / 1000) +
                " ms: the machine's lease ends in " +
                std::to_string(lease_.ends_at() > now ? (lease_.ends_at() - now) / 1000 : 0) + " ms"
          : "no lease from the control plane is known since the agent started";
  if (fence.empty()) return;
  log_warn("fencing: the tasks of at-most-one jobs are stopped before the lease ends",
           {{"TASKS", std::to_string(fence.size())}, {"REASON", why}});
  fenced_logged_ = true;
  for (Task* t : fence) {
    uint64_t grace = known ? lease_.fenced_grace(t->spec.stop_grace_us, now) : 0;
    // Its reason: a running task's is made when it exits (killed_for is added to it);
    // one in backoff or fetching ends here.
    if (t->state == TaskState::kBackoff || t->state == TaskState::kFetching)
      t->reason = std::string(kFencedReason) + why;
    else
      t->killed_for = std::string(kFencedReason) + why;
    if (auto s = m_.request_stop(*t, grace); !s.ok())
      log_error("cannot fence a task", {{"TASK_ID", t->id}, {"ERROR", s.error().str()}});
  }
  if (cp_) cp_->report_soon();
}

}  // namespace weft::agent
