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
#include "controlplane/tasks/calls.h"

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

TaskCalls::TaskCalls(const ShardParts& s)
    : model_(s.model),
      region_(s.region),
      agent_asks_(s.agent_asks),
      exec_relay_(s.exec_relay),
      fx_(s.fx),
      gate_(s.gate) {}

Result<const TaskRecord*> TaskCalls::task_for_operation(const json& p) const {
  TRY_ASSIGN(std::string id, task_id_param(p));
  auto it = model_.sched.tasks().find(id);
  if (it == model_.sched.tasks().end())
    return field_error("id", "no task " + id + " (ended tasks are forgotten after a while)")
        .with_code(rpc::kNotFound);
  return &it->second;
}

Result<json> TaskCalls::task_ls(const json&, const CallContext&) {
  std::vector<const TaskRecord*> all;
  all.reserve(model_.sched.tasks().size());
  for (const auto& [id, t] : model_.sched.tasks()) all.push_back(&t);
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->id < b->id; });
  json arr = json::array();
  for (const TaskRecord* t : all) arr.push_back(task_json(*t, model_.alloc));
  return json{{"tasks", arr}};
}

Result<json> TaskCalls::task_show(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  if (!c.session) return make_error("task.show is served on sessions only");
  json record = task_json(*t, model_.alloc);
  // Its environment and files hold secrets: shown to those who may change its job only.
  const bool secrets = gate_.may_change_jobs(gate_.caller(c), t->entitlement).ok();
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

Result<json> TaskCalls::task_signal(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  TRY(gate_.may_change_jobs(gate_.caller(c), t->entitlement));
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
    if (json h = region_.lending->holder_of(model_.alloc.spec(t->machine).name); !h.is_null()) {
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

Result<json> TaskCalls::task_exec(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  TRY(gate_.may_change_jobs(gate_.caller(c), t->entitlement));
  TRY_ASSIGN(ExecRequest req, parse_exec_request(p));
  if (t->state != TaskState::kRunning && t->state != TaskState::kDraining)
    return field_error("id", t->id + " is " + task_state_name(t->state) + ", not running")
        .with_code(rpc::kConflict);
  const std::string machine = model_.alloc.spec(t->machine).name;
  const std::string who = gate_.caller(c).who;
  const bool shared = !c.peer.via.empty();  // a front end's session: many operators'
  TRY(exec_relay_->admit(c.session, who, shared));
  rpc::Session* agent = model_.sessions.agent(t->machine);
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

Result<json> TaskCalls::task_restart(const json& p, const CallContext& c) {
  TRY_ASSIGN(const TaskRecord* t, task_for_operation(p));
  TRY(gate_.may_change_jobs(gate_.caller(c), t->entitlement));
  const std::string id = t->id, job = t->job;
  bool waits = false;
  TRY_ASSIGN(auto cmds, model_.sched.operations().restart_task(
                            id, "restarted by " + gate_.caller(c).who, now_us(), &waits));
  // Written, sent, the tick soon, and its controller asked when it waits for consent.
  TRY(fx_.apply({std::move(cmds), {job}, {}, true, waits ? job : std::string()}));
  return json{{"id", id}, {"job", job}, {"waiting_for_controller", waits}};
}

Result<json> TaskCalls::task_unhealthy(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(model_.broker, p, c));
  if (!p.contains("task") || !p["task"].is_string())
    return field_error("task", "is required: the task's id");
  if (!p.contains("reason") || !p["reason"].is_string() ||
      p["reason"].get<std::string>().size() > 1024)
    return field_error("reason", "is required: why its liveness check fails (at most 1 KiB)");
  const std::string id = p["task"].get<std::string>();
  auto it = model_.sched.tasks().find(id);
  // A machine speaks for its own tasks only.
  if (it == model_.sched.tasks().end() || it->second.machine != m)
    return field_error("task", "no task " + id + " on this machine").with_code(rpc::kNotFound);
  const std::string job = it->second.job;
  bool waits = false;
  TRY_ASSIGN(auto cmds, model_.sched.operations().liveness_failed(
                            id, p["reason"].get<std::string>(), now_us(), &waits));
  if (cmds.empty() && !waits) return json{{"task", id}};
  // Written, sent, the tick soon, and its controller asked when it waits for consent.
  TRY(fx_.apply({std::move(cmds), {job}, {}, true, waits ? job : std::string()}));
  return json{{"task", id}, {"waiting_for_controller", waits}};
}

void TaskCalls::register_calls(Calls& calls) {
  calls.add("task.ls", kViewerCall, this, &TaskCalls::task_ls);
  calls.add("task.show", kViewerCall, this, &TaskCalls::task_show);
  calls.add("task.signal", kOperatorCall, this, &TaskCalls::task_signal);
  calls.add("task.restart", kOperatorCall, this, &TaskCalls::task_restart);
  calls.add("task.exec", kOperatorCall, this, &TaskCalls::task_exec);
  calls.add("task.unhealthy", kMachineCall, this, &TaskCalls::task_unhealthy);
  // task.exec's bytes (exec_relay.h): taken only from the session that started the exec,
  // or from the agent's it runs on; notifications, neither answered nor audited.
  calls.add_plain("task.exec.input", [this](const json& p, const CallContext& c) {
    if (exec_relay_ && c.session) exec_relay_->from_caller(c.session, p);
    return Result<json>(json::object());
  });
  for (const char* m : {"task.exec.output", "task.exec.exit"})
    calls.add_plain(
        m, [this, exit = std::string(m) == "task.exec.exit"](const json& p, const CallContext& c) {
          if (exec_relay_ && c.session) exec_relay_->from_upstream(c.session, p, exit);
          return Result<json>(json::object());
        });
}

}  // namespace weft::cp
