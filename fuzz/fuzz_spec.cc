// Task specs (task.run params), the control plane's job specs, an entitlement's grants
// a machine's task report (also read from its text, as the control plane reads it) and
// its agent's task.usage answer, and a task's Prometheus text (its app metric):
// JSON from the network into plain structs, every error an Error, and what parses
// round-trips. Also, the same bytes as text: a /proc/net table
// the agent reads for the machine's own ports, and task output escaped for a terminal
// (no control character may be left in it), base64 and `task exec`'s request; the
// machine's lease as an agent keeps it (state_dir/lease) and as the control plane grants it.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "agent/host_ports.h"
#include "agent/machine_lease.h"
#include "common/base64.h"
#include "common/exec_request.h"
#include "common/job_spec.h"
#include "common/json_bounded.h"
#include "common/prometheus_text.h"
#include "common/strings.h"
#include "common/task_grants.h"
#include "common/task_report.h"
#include "common/task_spec.h"
#include "common/task_usage.h"
#include "controlplane/store/state_store.h"

using namespace weft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool udp : {false, true})
    for (uint16_t port : agent::parse_proc_net_listeners(text, udp))
      if (port == 0) __builtin_trap();
  for (unsigned char c : escape_terminal(text))
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) __builtin_trap();
  // A task's Prometheus text (autoscaling's app metric): any bytes; a sum is finite.
  for (std::string_view metric : {"x", "http_in_flight"})
    if (auto v = prometheus_sum(text, metric); v.ok() && !std::isfinite(*v)) __builtin_trap();
  // A machine's report read straight from its text (the control plane's hot path): any
  // bytes; what it accepts says the same when read again from its document.
  // Base64 from the network (task exec's bytes): what decodes encodes back the same.
  if (auto d = base64_decode(text); d.ok() && base64_encode(*d) != text) __builtin_trap();
  // The lease an agent kept in its state directory: what parses writes back the same.
  if (auto l = agent::MachineLease::from_text(text, "b"); l.has_value()) {
    auto again = agent::MachineLease::from_text(l->to_text("b"), "b");
    if (!again || again->renewed_from() != l->renewed_from() ||
        again->lease_us() != l->lease_us() || again->fence_after_us() != l->fence_after_us() ||
        l->fence_after_us() >= l->lease_us())
      __builtin_trap();
  }
  auto report = parse_task_report(text);
  (void)report_machine(text);
  auto j = parse_json_bounded(text);
  if (report.ok() && j.ok()) {
    auto again = parse_task_report(*j);
    if (!again.ok() || again->machine != report->machine || again->tasks != report->tasks ||
        again->changes != report->changes || again->base != report->base ||
        again->digest != report->digest || again->failures.size() != report->failures.size())
      __builtin_trap();
  }
  if (!j.ok()) return 0;
  // machine.register's reply as an agent reads its lease terms: refused, or consistent.
  {
    agent::MachineLease l;
    if (l.set_terms(*j).ok() && l.has_terms() && l.fence_after_us() >= l.lease_us())
      __builtin_trap();
  }
  // task.exec's params (the control plane and the agent read them alike): what parses
  // says the same when read again from what weftctl would send.
  if (auto ex = parse_exec_request(*j); ex.ok()) {
    auto again = parse_exec_request(exec_request_json(*ex));
    if (!again.ok() || again->command != ex->command || again->options.tty != ex->options.tty)
      __builtin_trap();
  }
  auto spec = parse_task_spec(*j);
  if (spec.ok()) {
    auto again = parse_task_spec(to_json(*spec));
    if (!again.ok()) __builtin_trap();  // the canonical form must parse
  }
  // The one job validator: what it accepts round-trips, and every task it would start
  // passes the agent's validator.
  auto job_spec = parse_job_spec(*j);
  if (job_spec.ok()) {
    if (!parse_job_spec(to_json(*job_spec)).ok()) __builtin_trap();
    if (!parse_task_spec(task_run_params(*job_spec, make_task_id(job_spec->name, 0, 1))).ok())
      __builtin_trap();
  }
  // Grants: what parses round-trips, and a spec is judged against them without throwing.
  auto grants = parse_task_grants(*j, "weft");
  if (grants.ok()) {
    auto again = parse_task_grants(to_json(*grants), "weft");
    if (!again.ok() || to_json(*again) != to_json(*grants)) __builtin_trap();
    if (spec.ok()) (void)check_task_grants(*spec, *grants, "fuzz", "weft");
  }
  (void)parse_task_report(*j);
  // An agent's task.usage answer and request (common/task_usage.h): what parses
  // round-trips exactly.
  auto usage = parse_usage_report(*j);
  if (usage.ok()) {
    auto again = parse_usage_report(to_json(*usage));
    if (!again.ok() || again->tasks != usage->tasks || again->interval_ms != usage->interval_ms)
      __builtin_trap();
  }
  (void)parse_usage_request(*j);
  auto job = cp::job_spec_from_json(*j);
  if (job.ok()) (void)cp::job_spec_to_json(*job);
  (void)cp::request_from_json(*j);
  return 0;
}
