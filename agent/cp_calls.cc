#include "agent/cp_calls.h"

#include "agent/manager.h"

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
      r.failed = t->state == TaskState::kFailed;
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
