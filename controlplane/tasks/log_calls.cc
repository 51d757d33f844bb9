// task.logs on the control plane (docs/logs.md): which task, who may read it, and the
// audit; the reading itself is the log relay's (controlplane/tasks/log_relay.h).
//
// Logs can hold secrets, so reading them is its own permission: admins, operators who
// own the entitlement the task ran in, and certificates matched by [access] logs. A
// viewer is not enough. A caller's first read of a task on a connection is audited, and
// so is every refusal. At most kMaxChunk bytes a reply.

#include "controlplane/tasks/log_calls.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/log_request.h"
#include "common/rpc/protocol.h"

namespace weft::cp {

using nlohmann::json;
using rpc::CallContext;

namespace {

constexpr size_t kMaxChunk = 256 * 1024;
constexpr int64_t kMaxWaitMs = 30'000;
constexpr size_t kMaxTail = 100'000;

// Ended in the control plane's view: nothing more will be written to its logs.
bool ended(TaskState s) {
  return s == TaskState::kStopped || s == TaskState::kExited || s == TaskState::kFailed ||
         s == TaskState::kLost;
}

}  // namespace

LogCalls::LogCalls(const ShardParts& s)
    : cfg_(s.cfg), model_(s.model), log_relay_(s.log_relay), audit_(s.audit), gate_(s.gate) {}

bool LogCalls::may_read_logs(const Caller& who, EntitlementId e) const {
  if (who.role == Role::kAdmin) return true;
  if (who.id && any_matches(cfg_.access.logs, *who.id)) return true;
  auto it = model_.broker.entitlements().find(e);
  return it != model_.broker.entitlements().end() && may_operate(who, it->second.owners);
}

Result<json> LogCalls::task_logs(const json& p, const CallContext& c) {
  if (!p.is_object()) return field_error("params", "must be an object");
  // The agent's own parameters, checked here as the agent checks them (one validator),
  // and what the control plane adds: the task, a long poll.
  TRY_ASSIGN(LogRequest req, parse_log_request(p, kMaxChunk, kMaxTail));
  json ask{{"stream", req.stream}};
  if (req.cursor) ask["cursor"] = {{"seq", req.cursor->seq}, {"offset", req.cursor->offset}};
  if (req.tail) ask["tail"] = *req.tail;
  const size_t max_bytes = req.max_bytes;
  TRY_ASSIGN(const int64_t wait_ms, int_member(p, "wait_ms", 0, 0, kMaxWaitMs));

  // The task: by its id, or the live task of a job's index (the newest one if none is).
  // A task the scheduler no longer keeps (it ended and was replaced) is still asked for
  // on the machine it ran on, which keeps the output of its last ended tasks.
  std::string id, job_name;
  EntitlementId ent = 0;  // the entitlement the task ran in (TaskRecord::entitlement)
  MachineId machine = 0;
  TaskState state = TaskState::kExited;
  // Checked whenever it is given, also beside `task`, which it does not select.
  TRY_ASSIGN(const int64_t index, int_member(p, "index", 0, 0, INT32_MAX));
  if (p.contains("task")) {
    if (!p["task"].is_string()) return field_error("task", "must be a task id");
    id = p["task"].get<std::string>();
    if (auto it = model_.sched.tasks().find(id); it != model_.sched.tasks().end()) {
      job_name = it->second.job;
      machine = it->second.machine;
      state = it->second.state;
      ent = it->second.entitlement;
    } else if (auto gone = model_.sched.tasks().erased_on(id)) {
      job_name = id.substr(0, id.find('.'));
      machine = gone->machine;
      ent = gone->entitlement;
    } else {
      return make_error("no task " + id + " (weftctl job show lists them)")
          .with_code(rpc::kNotFound);
    }
  } else if (p.contains("job")) {
    if (!p["job"].is_string()) return field_error("job", "must be a job's name");
    job_name = p["job"].get<std::string>();
    if (!model_.sched.job(job_name))
      return make_error("no job " + job_name).with_code(rpc::kNotFound);
    const TaskRecord* task = nullptr;
    for (const TaskRecord* t : model_.sched.tasks().refs_of(job_name)) {
      if (t->index != index) continue;
      bool live = !ended(t->state);
      if (!task || (live && ended(task->state)) ||
          (live == !ended(task->state) && t->since_us >= task->since_us))
        task = t;
    }
    if (!task)
      return make_error("job " + job_name + " has no task of index " + std::to_string(index))
          .with_code(rpc::kNotFound);
    id = task->id;
    machine = task->machine;
    state = task->state;
    ent = task->entitlement;
  } else {
    return field_error("task", "is required (or job and index)");
  }

  Caller who = gate_.caller(c);
  // A task's output belongs to the entitlement it ran in, recorded with the task (never
  // that of a job that took its job's name since). An entitlement removed since has no
  // owners: admins and access.logs only.
  json audited = {{"name", id}};
  if (!may_read_logs(who, ent)) {
    Result<json> no = make_error(who.who + " may not read the logs of " + id +
                                 ": logs need the admin role, an owner of the job's "
                                 "entitlement, or a certificate matching access.logs")
                          .with_code(rpc::kPermissionDenied);
    audit_->call(who, "task.logs", audited, no);
    return no;
  }
  if (!c.session) return make_error("task.logs needs a session").with_code(rpc::kUnavailable);
  TRY(log_relay_->admit(c.session, who.who));
  if (log_relay_->first_read(c.session, id)) audit_->call(who, "task.logs", audited, json());
  if (state == TaskState::kPending)
    return json{{"task", id},
                {"data", ""},
                {"state", task_state_name(state)},
                {"cursor", ask.value("cursor", json())},
                {"skipped", false}};

  ask["id"] = id;
  log_relay_->start(c.session, {who.who, id, machine, std::move(ask), max_bytes,
                                static_cast<uint64_t>(wait_ms) * 1000});
  return json();
}

void LogCalls::register_calls(Calls& calls) {
  calls.add("task.logs", kViewerCall, this, &LogCalls::task_logs);
}

}  // namespace weft::cp
