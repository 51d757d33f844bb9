#include "controlplane/machines/calls.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/clock.h"
#include "common/cp_link.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/oci.h"
#include "common/tls.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

MachineCalls::MachineCalls(const ShardParts& s)
    : cfg_(s.cfg),
      model_(s.model),
      maintenance_(s.maintenance),
      discovery_(s.discovery),
      group_(s.group),
      control_(s.control),
      region_(s.region),
      fx_(s.fx) {}

Result<json> MachineCalls::machine_register(const json& p, const CallContext& c) {
  if (!p.is_object()) return field_error("params", "must be an object");
  MachineInfo info;
  for (auto [key, out] : {std::pair{"machine", &info.id},
                          {"dc", &info.dc},
                          {"domain", &info.domain},
                          {"type", &info.type}}) {
    if (p.contains(key) && !p[key].is_string()) return field_error(key, "must be a string");
    if (p.contains(key)) *out = p[key].get<std::string>();
  }
  for (auto [key, out] :
       {std::pair{"cpu_milli", &info.capacity.cpu_milli}, {"mem_mb", &info.capacity.mem_mb}}) {
    if (!p.contains(key) || !p[key].is_number_integer())
      return field_error(key, "must be an integer");
    *out = p[key].get<int64_t>();
  }
  TRY(check_machine_name("machine", info.id, true));
  for (auto [key, value] :
       {std::pair{"dc", &info.dc}, {"domain", &info.domain}, {"type", &info.type}})
    TRY(check_machine_name(key, *value, false));
  if (p.contains("controllers")) {
    const json& cs = p["controllers"];
    bool ok = cs.is_array() && cs.size() <= 32;
    for (size_t i = 0; ok && i < cs.size(); ++i)
      ok = cs[i].is_string() && !cs[i].get<std::string>().empty() &&
           cs[i].get<std::string>().size() <= 32 &&
           cs[i].get<std::string>().find_first_not_of("abcdefghijklmnopqrstuvwxyz_") ==
               std::string::npos;
    if (!ok)
      return field_error("controllers", "must be a list of at most 32 cgroup controller names");
  }
  if (p.contains("reports_ready") && !p["reports_ready"].is_boolean())
    return field_error("reports_ready", "must be true or false");
  if (p.contains("serves_discovery") && !p["serves_discovery"].is_boolean())
    return field_error("serves_discovery", "must be true or false");
  // The jobs its DNS clients asked for (an agent that names none here is told of every
  // job, as agents before interest were).
  std::optional<std::vector<std::string>> interest;
  if (p.contains("discovery_interest")) {
    const json& d = p["discovery_interest"];
    bool ok = d.is_array() && d.size() <= ServiceTable::kMaxInterests;
    for (size_t i = 0; ok && i < d.size(); ++i)
      ok = d[i].is_string() && valid_job_name(d[i].get_ref<const std::string&>());
    if (!ok)
      return field_error("discovery_interest", "must be a list of at most " +
                                                   std::to_string(ServiceTable::kMaxInterests) +
                                                   " job names");
    interest = d.get<std::vector<std::string>>();
  }
  if (p.contains("port_range")) {
    const json& r = p["port_range"];
    bool ok = r.is_array() && r.size() == 2 && r[0].is_number_unsigned() &&
              r[1].is_number_unsigned() && r[0].get<uint64_t>() >= 1 &&
              r[1].get<uint64_t>() <= 65535 && r[0].get<uint64_t>() <= r[1].get<uint64_t>();
    if (!ok) return field_error("port_range", "must be [first, last], ports from 1 to 65535");
    info.port_first = r[0].get<uint16_t>();
    info.port_last = r[1].get<uint16_t>();
  }
  if (p.contains("reserved_ports")) {
    const json& r = p["reserved_ports"];
    bool ok = r.is_array() && r.size() <= weft::kMaxReservedPorts;
    for (size_t i = 0; ok && i < r.size(); ++i)
      ok = r[i].is_number_unsigned() && r[i].get<uint64_t>() >= 1 && r[i].get<uint64_t>() <= 65535;
    if (!ok)
      return field_error("reserved_ports", "must be a list of at most " +
                                               std::to_string(weft::kMaxReservedPorts) +
                                               " ports from 1 to 65535");
    for (const auto& v : r) info.reserved_ports.push_back(v.get<uint16_t>());
  }
  std::string address;
  if (p.contains("address")) {
    if (!p["address"].is_string() || !valid_ip_address(p["address"].get<std::string>()))
      return field_error("address", "must be an IPv4 or IPv6 address");
    address = p["address"].get<std::string>();
  }
  if (p.contains("boot_id") &&
      (!p["boot_id"].is_string() || p["boot_id"].get<std::string>().size() > 64))
    return field_error("boot_id", "must be a string of at most 64 characters");
  TRY(check_machine_identity(c.peer, info.id));
  if (auto known = model_.broker.find(info.id))
    TRY(claim_session(MachineSessions::Daemon::kAgent, *known, c));
  TRY_ASSIGN(MachineId m, model_.broker.register_machine(info, now_us()));
  TRY(claim_session(MachineSessions::Daemon::kAgent, m, c));
  model_.reports.lists.erase(m);  // a (re)started agent sends its whole list first
  // Back from a maintenance reboot: the boot id changed.
  std::string boot = p.value("boot_id", std::string());
  model_.reports.boot_ids[m] = boot;
  for (uint64_t id : maintenance_.registered(info.id, boot, now_realtime_us()))
    group_->unsaved().maintenance.insert(id);
  if (p.contains("controllers")) model_.reports.controllers[m] = p["controllers"];
  // Where its tasks are reached (service discovery): what the agent says, else the
  // address its session comes from (loopback for a Unix socket).
  if (address.empty()) address = c.peer.is_unix || c.peer.host.empty() ? "127.0.0.1" : c.peer.host;
  discovery_->set_address(m, address);
  // The agent answers DNS for service discovery: it gets the table (every job's, or
  // those it asked for), then their changes.
  if (p.value("serves_discovery", false))
    discovery_->subscribe(m, c.session, !interest, interest.value_or(std::vector<std::string>{}));
  // An agent older than readiness checks reports "running" for what is available.
  if (p.value("reports_ready", false))
    model_.reports.running_means_ready.erase(m);
  else
    model_.reports.running_means_ready.insert(m);
  TRY(fx_.persist({}, {m}));
  json reply{{"machine", info.id},
             {"profile", model_.broker.desired_profile(m)},
             {"heartbeat_interval_ms", cfg_.broker.heartbeat_interval_us / 1000},
             // An unchanged machine's heartbeat may come as a notification (docs/protocol.md).
             {"quiet_heartbeats", true},
             // The machine's lease (docs/jobs.md, "At most one copy"): its agent fences the
             // tasks of at-most-one jobs after fence_after_ms without an answer.
             {"lease",
              {{"duration_ms", cfg_.broker.lease() / 1000},
               {"fence_after_ms", cfg_.broker.fence_after() / 1000}}}};
  // A region's shard: who holds the machine, and since which epoch (HolderFence).
  if (region_.lending)
    if (json h = region_.lending->holder_of(info.id); !h.is_null()) reply["holder"] = std::move(h);
  return reply;
}

Result<json> MachineCalls::machine_heartbeat(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(model_.broker, p, c));
  TRY(claim_session(MachineSessions::Daemon::kAgent, m, c));
  TRY(model_.broker.heartbeat(p["machine"].get<std::string>(), now_us()));
  return json{{"profile", model_.broker.desired_profile(m)}};
}

Result<json> MachineCalls::machine_report(const std::string& machine,
                                          Result<weft::TaskReport> parsed, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(model_.broker, machine, c));
  TRY(claim_session(MachineSessions::Daemon::kAgent, m, c));
  // The machine is alive whatever its report says: a report refused below (a state this
  // version does not know, from a newer agent) must not get its tasks declared lost.
  (void)model_.broker.heartbeat(machine, now_us());
  TRY_ASSIGN(weft::TaskReport report, std::move(parsed));
  MachineReports::TaskListSeen& last = model_.reports.lists[m];
  uint64_t now = now_us();
  weft::TaskChanges applied;
  bool whole = true;
  if (report.tasks) {
    last.tasks = std::move(*report.tasks);
    last.sum = {};
    for (const auto& [id, state] : last.tasks) last.sum.add(id, task_state_name(state));
    last.digest = std::move(report.digest);
  } else if (last.digest.empty() || report.digest != last.digest) {
    if (!report.changes || report.base != last.digest || last.digest.empty())
      // Changes from, or a digest of, a list this process does not hold (it restarted,
      // or the lists differ).
      return json{{"resend", true}};
    applied = weft::apply_task_changes(last.tasks, last.sum, *report.changes);
    last.digest = last.sum.hex();
    if (last.digest != report.digest || last.tasks.size() > weft::kMaxReportedTasks) {
      last.digest.clear();  // the lists differ (or grew past the bound): the whole list next
      last.tasks.clear();
      return json{{"resend", true}};
    }
    // The changed tasks alone, unless a whole-list check is due (a machine that changes
    // all the time sends no digest-only heartbeat; tasks it should run but lacks are
    // found by the whole list's walk).
    whole = now - last.reconciled_us >= cfg_.broker.heartbeat_interval_us;
  }
  std::vector<std::string> forget;
  if (whole) last.reconciled_us = now;
  std::vector<Command> cmds;
  if (model_.reports.running_means_ready.count(m)) {
    auto ready = [](TaskState s) { return s == TaskState::kRunning ? TaskState::kReady : s; };
    if (whole) {
      cmds = model_.sched.report_list(m, last.tasks, now, &forget, &report.failures, true);
    } else {
      for (auto& e : applied)
        if (e.second) e.second = ready(*e.second);
      cmds = model_.sched.report_changes(m, applied, now, &forget, &report.failures);
    }
  } else {
    cmds = whole ? model_.sched.report_list(m, last.tasks, now, &forget, &report.failures)
                 : model_.sched.report_changes(m, applied, now, &forget, &report.failures);
  }
  auto changed = model_.sched.take_reported_changes();
  if (!cmds.empty() || !changed.empty())
    TRY(fx_.persist({}, {}));  // tasks; the machine row is as it was
  fx_.send(cmds);
  for (const auto& job : changed)  // controllers hear of their tasks' changes at once
    if (control_) control_->ask(job);
  // Ended tasks whose end is now durable here: the machine stops reporting them, so a
  // report stays the size of what the machine runs.
  return json{{"commands", cmds.size()}, {"forget", forget}};
}

Result<json> MachineCalls::health_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(model_.broker, p, c));
  if (!p.contains("verdict") || !p["verdict"].is_string())
    return field_error("verdict", "must be ok, degraded, failed or unknown");
  // What machine.ls shows of every machine is bounded: the first kMaxReportedProblems
  // problems, each at most kMaxProblemBytes (a larger one keeps its probe's name). A
  // note beside the verdict: cut, never a reason to refuse the verdict itself.
  json problems = json::array();
  if (p.contains("problems")) {
    const json& pr = p["problems"];
    if (!pr.is_array()) return field_error("problems", "must be a list of objects");
    for (const auto& x : pr) {
      if (!x.is_object()) return field_error("problems", "must be a list of objects");
      if (problems.size() >= weft::kMaxReportedProblems) break;
      if (x.dump(-1, ' ', false, json::error_handler_t::replace).size() <= weft::kMaxProblemBytes) {
        problems.push_back(x);
        continue;
      }
      std::string probe = x.contains("probe") && x["probe"].is_string()
                              ? x["probe"].get<std::string>().substr(0, 128)
                              : "?";
      problems.push_back(
          {{"probe", probe},
           {"detail", "(cut: more than " + std::to_string(weft::kMaxProblemBytes) + " bytes)"}});
    }
  }
  std::string before = model_.broker.state_of(m);
  TRY(model_.broker.health(p["machine"].get<std::string>(), p["verdict"].get<std::string>(),
                           now_us()));
  model_.sessions.track_hcs(m, c.session);
  model_.reports.problems[m] = std::move(problems);
  // A machine that failed has its tasks replaced now, and one that became healthy
  // takes what waited for it, not at the next tick; an unchanged verdict (every
  // heartbeat) costs nothing more.
  if (model_.broker.state_of(m) != before) fx_.kick();
  // hcs reports a changed verdict at once; otherwise a keepalive at this interval.
  return json{{"heartbeat_interval_ms", keepalive_us() / 1000}};
}

Result<json> MachineCalls::profile_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(model_.broker, p, c));
  if (!p.contains("profile") || !p["profile"].is_string())
    return field_error("profile", "must be the applied profile's name");
  if (const auto& applied = p["profile"].get_ref<const std::string&>();
      !applied.empty() && !weft::valid_profile_name(applied))
    return field_error("profile",
                       "must be a profile's name (1-64 letters, digits, '.', '-' and '_')");
  if (p.contains("state") &&
      (!p["state"].is_string() || p["state"].get<std::string>().size() > 1024))
    return field_error("state", "must be the last switch's outcome (at most 1 KiB)");
  std::set<std::string> offered;
  if (p.contains("profiles")) {
    const json& names = p["profiles"];
    if (!names.is_array() || names.size() > weft::kMaxReportedProfiles)
      return field_error("profiles", "must be a list of at most " +
                                         std::to_string(weft::kMaxReportedProfiles) +
                                         " profile names");
    for (const auto& n : names) {
      if (!n.is_string() || !weft::valid_profile_name(n.get_ref<const std::string&>()))
        return field_error("profiles", "must hold profile names only");
      offered.insert(n.get<std::string>());
    }
  }
  TRY(claim_session(MachineSessions::Daemon::kSidekick, m, c, keepalive_us()));
  if (p.contains("profiles")) model_.reports.profiles_offered[m] = std::move(offered);
  bool changed = model_.broker.persisted(m).applied_profile != p["profile"].get<std::string>();
  TRY(model_.broker.profile_applied(p["machine"].get<std::string>(),
                                    p["profile"].get<std::string>()));
  model_.reports.profile_state[m] = p.value("state", "");
  model_.pool_changes.reported(m);  // the reply carries the desired profile
  if (changed) {                    // a report every heartbeat writes and schedules nothing
    TRY(fx_.persist({}, {m}));
    fx_.kick();
  }
  // Sidekick reports a switch at once; otherwise a keepalive at this interval.
  return json{{"desired", model_.broker.desired_profile(m)},
              {"heartbeat_interval_ms", keepalive_us() / 1000}};
}

// Pages of `limit` machines (default 500, at most 1000) in the order they first
// registered, from the one after `after`: a reply stays far below the line limit
// however large the fleet. `next` names the last machine of a page that is not the last.
Result<json> MachineCalls::machine_ls(const json& p, const CallContext&) {
  size_t limit = 500;
  if (p.contains("limit")) {
    if (!p["limit"].is_number_unsigned() || p["limit"].get<uint64_t>() < 1 ||
        p["limit"].get<uint64_t>() > 1000)
      return field_error("limit", "must be a number of machines from 1 to 1000");
    limit = p["limit"].get<size_t>();
  }
  MachineId from = 0;
  if (p.contains("after")) {
    if (!p["after"].is_string()) return field_error("after", "must be a machine id");
    auto m = model_.broker.find(p["after"].get<std::string>());
    if (!m) return field_error("after", "no such machine");
    from = *m + 1;
  }
  json arr = json::array();
  MachineId m = from;
  for (; m < model_.alloc.machine_count() && arr.size() < limit; ++m) {
    if (model_.broker.removed(m)) continue;
    arr.push_back(machine_json(m, model_.alloc, model_.broker, model_.reports, model_.sessions));
  }
  json out{{"machines", arr}};
  while (m < model_.alloc.machine_count() && model_.broker.removed(m)) ++m;
  if (m < model_.alloc.machine_count() && !arr.empty()) out["next"] = arr.back()["machine"];
  return out;
}

Result<json> MachineCalls::machine_show(const json& p, const CallContext&) {
  TRY_ASSIGN(MachineId m, machine_of(model_.broker, p));
  json j = machine_json(m, model_.alloc, model_.broker, model_.reports, model_.sessions);
  json tasks = json::array();
  for (const auto& t : model_.sched.tasks().on(m)) tasks.push_back(task_json(t, model_.alloc));
  j["task_list"] = tasks;
  json events = json::array();
  for (const auto& e : model_.broker.unavailability().all())
    if (e.machine == j["machine"])
      events.push_back({{"at_us", e.at_us}, {"kind", e.kind}, {"detail", e.detail}});
  j["events"] = events;
  return j;
}

Result<json> MachineCalls::machine_drain(const json& p, const CallContext&) {
  TRY_ASSIGN(MachineId m, machine_of(model_.broker, p));
  if (p.contains("drained") && !p["drained"].is_boolean())
    return field_error("drained", "must be true or false");
  bool drained = p.value("drained", true);
  TRY(model_.broker.drain(p["machine"].get<std::string>(), drained, now_us()));
  std::vector<Command> cmds;
  if (drained)
    cmds = model_.sched.moves().machine_drain(m, now_us());
  else
    model_.sched.moves().machine_undrained(m);
  // Written (with the tasks the drain changed and their jobs), sent, the tick soon.
  TRY(fx_.apply({std::move(cmds), {}, {m}, true}));
  return json{{"machine", p["machine"]}, {"drained", drained}};
}

// A machine that is gone for good leaves the listings: only a dead one whose tasks
// have all moved. Registering again brings it back.
Result<json> MachineCalls::machine_rm(const json& p, const CallContext&) {
  TRY_ASSIGN(MachineId m, machine_of(model_.broker, p));
  if (int n = model_.alloc.tasks_on(m); n > 0 && !model_.broker.removed(m))
    return field_error("machine", "machine " + p["machine"].get<std::string>() + " still holds " +
                                      std::to_string(n) +
                                      " tasks (their replacements wait for the failure budget, "
                                      "or it is not dead)");
  TRY(forget_machine(m));
  return json{{"machine", p["machine"]}, {"removed", true}};
}

Status MachineCalls::forget_machine(MachineId m, const char* left_for) {
  TRY(model_.broker.remove(model_.alloc.spec(m).name, now_us(), left_for));
  EntitlementId before = model_.alloc.entitlement_of(m);
  if (before != kFreePool) TRY(model_.alloc.assign(m, kFreePool));
  model_.reports.forget(m);
  model_.pool_changes.forget(m);
  if (auto s = fx_.persist({}, {m}); !s.ok()) {
    model_.broker.set_removed(m, false);  // not durable: not removed
    if (before != kFreePool) (void)model_.alloc.assign(m, before);
    return std::move(s).error();
  }
  return {};
}

void MachineCalls::register_calls(Calls& calls) {
  calls.add("machine.register", kMachineCall, this, &MachineCalls::machine_register);
  calls.add("machine.heartbeat", kMachineCall, this, &MachineCalls::machine_heartbeat);
  calls.add("health.report", kMachineCall, this, &MachineCalls::health_report);
  calls.add("profile.report", kMachineCall, this, &MachineCalls::profile_report);
  calls.add("machine.ls", kViewerCall, this, &MachineCalls::machine_ls);
  calls.add("machine.show", kViewerCall, this, &MachineCalls::machine_show);
  calls.add("machine.drain", kAdminCall, this, &MachineCalls::machine_drain);
  calls.add("machine.rm", kAdminCall, this, &MachineCalls::machine_rm);
  // A machine's report every heartbeat: read straight from its text (docs/protocol.md).
  calls.add_report(
      [this](const std::string& machine, Result<TaskReport> report, const CallContext& c) {
        return machine_report(machine, std::move(report), c);
      });
}

}  // namespace weft::cp
