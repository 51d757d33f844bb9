// One task's operations through the control plane (docs/operations.md, "One task"):
// task.show (the record and its agent's detail, from anywhere), task.signal (a signal,
// SIGKILL for `weftctl task kill`), task.restart (its TaskController asked first) and
// task.exec (a command inside it, its bytes carried by ExecRelay).
// The changes are for operators of the task's entitlement, audited as every operator
// call is; the agent is asked with a deadline (AgentAsks), never waited on.
#include <cctype>

#include "common/exec_request.h"
#include "common/rpc/protocol.h"
#include "common/secret_box.h"
#include "controlplane/daemon/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {

constexpr uint64_t kAgentTimeoutUs = 5'000'000;

Result<std::string> task_id_param(const json& p) {
  if (!p.is_object() || !p.contains("id") || !p["id"].is_string() ||
      p["id"].get<std::string>().empty() || p["id"].get<std::string>().size() > 256)
    return field_error("id", "is required: a task id (weftctl task ls --cluster)");
  return p["id"].get<std::string>();
}

}  // namespace

Result<const TaskRecord*> Manager::task_for_operation(const json& p) const {
  TRY_ASSIGN(std::string id, task_id_param(p));
  auto it = sched_.tasks().find(id);
  if (it == sched_.tasks().end())
    return field_error("id", "no task " + id + " (ended tasks are forgotten after a while)")
        .with_code(rpc::kNotFound);
  return &it->second;
}

Result<json> Manager::api_task_show(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  if (!c.session) return make_error("task.show is served on sessions only");
  json record = task_json(*t, alloc_);
  // Its environment and files hold secrets: shown to those who may change its job only.
  const bool secrets = may_change_jobs(caller(c), t->entitlement).ok();
  auto reply = c.session->defer_reply();
  agent_asks_->call(t->machine, "task.show", {{"id", t->id}}, kAgentTimeoutUs,
                    [record, secrets, reply](Result<json> r) {
                      json out = record;
                      if (r.ok()) {
                        json detail = std::move(r).value();
                        if (!secrets && detail.is_object() && detail.contains("spec"))
                          hide_task_secrets(detail["spec"]);
                        out["agent"] = std::move(detail);
                      } else {
                        out["agent_error"] = r.error().str();
                      }
                      reply(out);
                    });
  return json();
}

Result<json> Manager::api_task_signal(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  TRY(may_change_jobs(caller(c), t->entitlement));
  std::string signal = "SIGKILL";
  if (p.contains("signal")) {
    const json& s = p["signal"];
    bool name = s.is_string() && !s.get<std::string>().empty() && s.get<std::string>().size() <= 16;
    if (name)
      for (char ch : s.get<std::string>())
        name = name && (std::isupper(static_cast<unsigned char>(ch)) ||
                        std::isdigit(static_cast<unsigned char>(ch)) || ch == '+');
    if (!name) return field_error("signal", "must be a signal's name, such as SIGHUP");
    signal = s.get<std::string>();
  }
  if (t->state != TaskState::kRunning && t->state != TaskState::kStarting &&
      t->state != TaskState::kDraining && t->state != TaskState::kStopping)
    return field_error("id", t->id + " is " + task_state_name(t->state) + ", not running")
        .with_code(rpc::kConflict);
  if (!c.session) return make_error("task.signal is served on sessions only");
  json params{{"id", t->id}, {"signal", signal}};
  // A region's shard names itself and the machine's epoch (agent/cp_session.h).
  if (region_.lending)
    if (json h = region_.lending->holder_of(alloc_.spec(t->machine).name); !h.is_null()) {
      params["holder"] = h["shard"];
      params["epoch"] = h["epoch"];
    }
  auto reply = c.session->defer_reply();
  const std::string id = t->id;
  agent_asks_->call(t->machine, "task.kill", params, kAgentTimeoutUs,
                    [id, signal, reply](Result<json> r) {
                      if (!r.ok()) return reply(std::move(r).error());
                      reply(json{{"id", id}, {"signal", signal}});
                    });
  return json();
}

Result<json> Manager::api_task_exec(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  TRY(may_change_jobs(caller(c), t->entitlement));
  TRY_ASSIGN(ExecRequest req, parse_exec_request(p));
  if (t->state != TaskState::kRunning && t->state != TaskState::kDraining)
    return field_error("id", t->id + " is " + task_state_name(t->state) + ", not running")
        .with_code(rpc::kConflict);
  const std::string machine = alloc_.spec(t->machine).name;
  const std::string who = caller(c).who;
  const bool shared = !c.peer.via.empty();  // a front end's session: many operators'
  TRY(exec_relay_->admit(c.session, who, shared));
  rpc::Session* agent = sessions_.agent(t->machine);
  if (!agent)
    return make_error("machine " + machine + " has no session with the control plane")
        .with_code(rpc::kUnavailable);
  json params = exec_request_json(req);
  if (region_.lending)
    if (json h = region_.lending->holder_of(machine); !h.is_null()) {
      params["holder"] = h["shard"];
      params["epoch"] = h["epoch"];
    }
  rpc::ReplyFn reply = c.session->defer_reply();
  exec_relay_->start(
      c.session, who, agent, "task.exec", std::move(params),
      [reply, machine](Result<json> r) {
        if (r.ok()) r = json{{"exec", (*r)["exec"]}, {"machine", machine}};
        reply(std::move(r));
      },
      shared);
  return json();
}

Result<json> Manager::api_task_restart(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  TRY(may_change_jobs(caller(c), t->entitlement));
  const std::string id = t->id, job = t->job;
  bool waits = false;
  TRY_ASSIGN(auto cmds, sched_.restart_task(id, "restarted by " + caller(c).who, now_us(), &waits));
  TRY(persist({job}, {}));
  send(cmds);
  kick();
  if (waits && control_) control_->ask(job);
  return json{{"id", id}, {"job", job}, {"waiting_for_controller", waits}};
}

Result<json> Manager::api_task_unhealthy(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  if (!p.contains("task") || !p["task"].is_string())
    return field_error("task", "is required: the task's id");
  if (!p.contains("reason") || !p["reason"].is_string() ||
      p["reason"].get<std::string>().size() > 1024)
    return field_error("reason", "is required: why its liveness check fails (at most 1 KiB)");
  const std::string id = p["task"].get<std::string>();
  auto it = sched_.tasks().find(id);
  // A machine speaks for its own tasks only.
  if (it == sched_.tasks().end() || it->second.machine != m)
    return field_error("task", "no task " + id + " on this machine").with_code(rpc::kNotFound);
  const std::string job = it->second.job;
  bool waits = false;
  TRY_ASSIGN(auto cmds,
             sched_.liveness_failed(id, p["reason"].get<std::string>(), now_us(), &waits));
  if (cmds.empty() && !waits) return json{{"task", id}};
  TRY(persist({job}, {}));
  send(cmds);
  kick();
  if (waits && control_) control_->ask(job);
  return json{{"task", id}, {"waiting_for_controller", waits}};
}

}  // namespace weft::cp
