#include "controlplane/api/audit_log.h"

#include "common/log.h"
#include "common/rpc/session.h"
#include "common/tls.h"

namespace weft::cp {

using json = nlohmann::json;

void AuditLog::call(const Caller& who, const std::string& method, const json& p,
                    const Result<json>& r) {
  AuditRecord a;
  a.who = who.who;
  a.role = role_name(who.role);
  a.method = method;
  for (const char* key : {"name", "machine", "id"})
    if (p.is_object() && p.contains(key) && p[key].is_string()) {
      a.target = p[key].get<std::string>().substr(0, 256);
      break;
    }
  // A command run inside a task is audited with its command line (each argument quoted
  // where it must be, the whole cut at 2 KiB).
  if (method == "task.exec" && p.is_object() && p.contains("command") && p["command"].is_array()) {
    std::string line;
    for (const auto& arg : p["command"]) {
      std::string s = arg.is_string() ? arg.get<std::string>() : arg.dump();
      bool plain = !s.empty() && s.find_first_of(" \t\n'\"\\$`;&|<>()*?") == std::string::npos;
      line += (line.empty() ? "" : " ") +
              (plain ? s : json(s).dump(-1, ' ', false, json::error_handler_t::replace));
    }
    a.target += " -- " + line.substr(0, 2048);
  }
  a.digest = tls::sha256_hex(p.dump(-1, ' ', false, json::error_handler_t::replace));
  if (r.ok())
    a.result = "ok";
  else
    a.result = std::string(r.error().code == rpc::kPermissionDenied ? "denied: " : "error: ") +
               r.error().str().substr(0, 512);
  if (r.ok() && (method == "job.create" || method == "job.update") && !a.target.empty())
    job_operator_[a.target] = a.who;
  write(a);
}

void AuditLog::write(const AuditRecord& a) {
  log_info("audit: " + a.who + " " + a.method + " " + a.target + ": " + a.result,
           {{"AUDIT_WHO", a.who},
            {"AUDIT_ROLE", a.role},
            {"AUDIT_METHOD", a.method},
            {"AUDIT_TARGET", a.target},
            {"AUDIT_PARAMS_SHA256", a.digest},
            {"AUDIT_RESULT", a.result}});
  Status written = group_.open();
  if (written.ok()) written = store_.put_audit(a);
  if (!written.ok())
    log_error("audit entry not written to the store (the journal has it): " +
              written.error().str());
}

void AuditLog::autoscaler(const std::string& job, int64_t from, int64_t to,
                          const std::string& reason, const Status& done) {
  AuditRecord a;
  a.who = "autoscaler for " + job_operator(job);
  a.role = "autoscaler";
  a.method = "job.scale";
  a.target = job;
  std::string what = reason.find(" -> ") == std::string::npos
                         ? std::to_string(from) + " -> " + std::to_string(to) + ": " + reason
                         : reason;
  a.digest = tls::sha256_hex(what);
  a.result = (done.ok() ? "ok: " : "error: " + done.error().str() + ": ") + what;
  a.result = a.result.substr(0, 768);
  write(a);
}

void AuditLog::rebalancer(const std::string& ent, const std::string& job, const std::string& task,
                          const std::string& from, const std::string& to, const std::string& aim) {
  AuditRecord a;
  a.who = "rebalancer of entitlement " + ent;
  a.role = "rebalancer";
  a.method = "task.move";
  a.target = task;
  std::string what = "job " + job + ": " + from + " -> " + to + ": " + aim;
  a.digest = tls::sha256_hex(what);
  a.result = ("ok: " + what).substr(0, 768);
  write(a);
}

std::string AuditLog::job_operator(const std::string& job) {
  if (!loaded_) {
    loaded_ = true;
    auto rows = store_.audit(0, StateStore::kMaxAudit);  // oldest first
    if (rows.ok())
      for (const auto& r : *rows)
        if (r.result == "ok" && (r.method == "job.create" || r.method == "job.update") &&
            !job_operator_.count(r.target))
          job_operator_[r.target] = r.who;
    // Entries made since this process started are newer than any row: kept as they are.
  }
  auto it = job_operator_.find(job);
  return it == job_operator_.end() ? "an operator no longer in the audit log" : it->second;
}

void AuditLog::controller(const std::string& job, const std::string& controller,
                          const std::vector<std::string>& acks, const std::vector<Command>& done) {
  std::string did;
  for (const auto& c : done) {
    if (c.kind == Command::Kind::kPrefetch) continue;
    did += (did.empty() ? "" : ", ") +
           std::string(c.kind == Command::Kind::kStart ? "start " : "stop ") + c.task_id;
    if (did.size() > 400) {
      did += ", ...";
      break;
    }
  }
  if (did.empty()) return;  // acknowledged, nothing done yet (or nothing pending)
  AuditRecord a;
  // Who acted: the controller, on behalf of the operator who set the job (and with it
  // the controller) up.
  a.who = controller + " for " + job_operator(job);
  a.role = "controller";
  a.method = "taskcontrol.ack";
  a.target = job;
  a.digest = tls::sha256_hex(json(acks).dump());
  a.result = "ok: " + did;
  write(a);
}

}  // namespace weft::cp
