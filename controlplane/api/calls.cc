#include "controlplane/api/calls.h"

#include "common/clock.h"
#include "controlplane/api/audit_log.h"
#include "controlplane/api/cp_metrics.h"
#include "controlplane/store/group_commit.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

Result<json> Calls::guarded(const std::string& method, int access, const CallContext& c,
                            const std::string* machine, const json& audited,
                            const std::function<Result<json>()>& handle) {
  Caller who = parts_.gate.caller(c);
  Result<json> r = json();
  GroupCommit* group = parts_.group.get();
  bool own_commit = access >= kOperatorCall && !parts_.on_etcd && group;
  // An operator's change on the local disk: refused before anything of it is applied
  // when the disk takes no writes (full, failing), not applied in memory and then
  // refused (it would be written later, though its caller heard no).
  Status ready;
  if (own_commit) {
    ready = group->ready_for_change();
    group->set_sync(true);
  }
  uint64_t t0 = now_monotonic_us();
  if (auto s = parts_.gate.permit(who, access, method); !s.ok()) {
    r = std::move(s).error();
  } else if (!ready.ok()) {
    r = std::move(ready).error();
  } else if (access == kMachineCall && parts_.admit && machine) {
    // A region's machine that belongs elsewhere is told where (kMoved), and its
    // session ends once it has heard it: its daemon goes there.
    if (auto a = parts_.admit(*machine); !a.ok()) {
      if (c.session) c.session->close_when_sent();
      r = std::move(a).error();
    } else {
      r = handle();
    }
  } else {
    r = handle();
  }
  parts_.metrics.request(method, static_cast<double>(now_monotonic_us() - t0) / 1e6, r.ok());
  // The audit entry joins the next group commit; the reply waits for it.
  if (group) group->set_sync(false);
  if (access >= kOperatorCall && parts_.audit) parts_.audit->call(who, method, audited, r);
  return r;
}

void Calls::add_report(ReportHandler h) {
  table_.add_raw(
      "machine.report", [this, h = std::move(h)](std::string_view text, const CallContext& c) {
        Result<TaskReport> report = parse_task_report(text);
        // A refused report still names its machine (it is alive whatever it says).
        std::string machine = report.ok() ? report->machine : report_machine(text);
        Result<json> r =
            guarded("machine.report", kMachineCall, c, machine.empty() ? nullptr : &machine, json(),
                    [&] { return h(machine, std::move(report), c); });
        // A quiet heartbeat (a notification: docs/protocol.md) is answered only when there
        // is something to say: send the whole list (any refusal too: the list comes as a
        // request, whose answer says why), or forget these ended tasks.
        if (c.session && !c.session->answering()) {
          if (!r.ok() || r->value("resend", false))
            c.session->notify("report.resend", json::object());
          else if (r->is_object() && r->contains("forget") && !(*r)["forget"].empty())
            c.session->notify("report.forget", json{{"forget", (*r)["forget"]}});
        }
        return r;
      });
}

}  // namespace weft::cp
