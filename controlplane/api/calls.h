// The calls the control plane answers (docs/protocol.md), registered by the features
// that answer them: each feature adds its methods here with the level its caller needs
// (access.h, Access), and holds their handlers; this table only routes and guards.
//
// Every call added with a level goes through one guard, in this order: the caller's
// level checked (Gate::permit); a region's machine that belongs to another control
// plane told where (kMoved) and its session closed once it heard it; the handler; the
// request's metric; and, for operator and admin calls, the audit entry (refusals too).
// Operator and admin calls on sqlite commit on their own, after the machines' batch so
// far, so that their answer says whether their change was written; on etcd they join
// the group like the machines' calls (a group etcd did not take is never answered).
//
// Calls that check their caller themselves (a region's roles', an exec's bytes) are
// added plain. Not thread-safe: the event loop's.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/rpc/session.h"
#include "common/task_report.h"
#include "controlplane/api/gate.h"

namespace weft::cp {

class AuditLog;
class CpMetrics;
class GroupCommit;

class Calls {
 public:
  using json = nlohmann::json;
  using Handler = std::function<Result<json>(const json&, const rpc::CallContext&)>;
  // machine.report, read without a document: the machine it names (also when the report
  // is refused) and the report as weft::parse_task_report read it, or why not.
  using ReportHandler = std::function<Result<json>(
      const std::string& machine, Result<TaskReport> report, const rpc::CallContext&)>;
  struct Parts {
    const Gate& gate;
    CpMetrics& metrics;
    // Made with the store (after the calls are added): read at each call.
    const std::unique_ptr<GroupCommit>& group;
    const std::unique_ptr<AuditLog>& audit;
    bool on_etcd = false;
    // A region's machine that belongs elsewhere: why (kMoved). Unset: every machine is
    // this control plane's.
    std::function<Status(const std::string& machine)> admit;
  };
  Calls(rpc::Dispatcher& table, Parts parts) : table_(table), parts_(std::move(parts)) {}

  // A guarded call of level `access` (Access).
  void add(const std::string& method, int access, Handler h) {
    add_guarded(method, access, std::move(h));
  }
  template <class F>
  void add(const std::string& method, int access, F* self,
           Result<json> (F::*fn)(const json&, const rpc::CallContext&)) {
    add_guarded(method, access,
                [self, fn](const json& p, const rpc::CallContext& c) { return (self->*fn)(p, c); });
  }
  // machine.report (a machine call): its quiet form is answered only when there is
  // something to say (report.resend, report.forget: docs/protocol.md).
  void add_report(ReportHandler h);
  // A call that checks its caller itself: neither guarded nor audited here.
  void add_plain(const std::string& method, Handler h) { table_.add(method, std::move(h)); }
  // The table, for a call that hands another on (frontend.forward).
  const rpc::Dispatcher& table() const { return table_; }

 private:
  // The table's entry for a guarded call: `call` kept as it is, not in a second function.
  template <class Call>
  void add_guarded(const std::string& method, int access, Call call) {
    table_.add(method, [this, method, access, call = std::move(call)](const json& p,
                                                                      const rpc::CallContext& c) {
      return guarded(method, access, c, machine_named(p), p, [&] { return call(p, c); });
    });
  }
  // The machine a machine's call names, if it names one.
  static const std::string* machine_named(const json& p) {
    return p.is_object() && p.contains("machine") && p["machine"].is_string()
               ? &p["machine"].get_ref<const std::string&>()
               : nullptr;
  }
  Result<json> guarded(const std::string& method, int access, const rpc::CallContext& c,
                       const std::string* machine, const json& audited,
                       const std::function<Result<json>()>& handle);
  rpc::Dispatcher& table_;
  Parts parts_;
};

}  // namespace weft::cp
