// weft-controlplane's JSON-RPC API (docs/protocol.md): one named handler per method,
// listed in one table with whether it is an operator call (Unix socket, weft group).
// The handlers translate between the protocol and the modules (broker, scheduler,
// allocator); what they change is written before they answer.
#include <algorithm>
#include <map>
#include <set>

#include "common/cp_link.h"
#include "common/json_bounded.h"
#include "common/task_report.h"
#include "common/tls.h"

#include "common/clock.h"
#include "common/log.h"
#include "common/oci.h"
#include "controlplane/daemon/manager.h"
#include "controlplane/tend/rebalancer.h"
#include "controlplane/usage/top.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {

constexpr size_t kMaxOwners = 64;

Result<std::vector<std::string>> owners_from(const json& j) {
  if (!j.is_array() || j.size() > kMaxOwners)
    return field_error("owners", "must be a list of at most 64 principals (CN=, OU=, O=, DNS=)");
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) return field_error("owners", "must be a list of strings");
    if (auto s = check_principal_pattern(j[i].get<std::string>()); !s.ok())
      return field_error("owners[" + std::to_string(i) + "]", s.error().message);
    out.push_back(j[i].get<std::string>());
  }
  return out;
}

// A job spec as shown to a viewer: environment values and files' contents (where
// secrets go, docs/images.md) replaced.
void hide_secrets(json& spec) {
  if (auto task = spec.find("task"); task != spec.end()) hide_task_secrets(*task);
}

// An entitlement's own fields, as entitlement.ls and entitlement.show give them.
json entitlement_json(EntitlementId id, const EntitlementSpec& e) {
  return {{"id", id},   {"name", e.name},     {"quota", e.quota},           {"profile", e.profile},
          {"dc", e.dc}, {"owners", e.owners}, {"grants", to_json(e.grants)}};
}

}  // namespace

Result<json> Manager::api_controlplane_status(const json&, const CallContext&) {
  // Answered by followers too (the one call they do not refuse): clients find the
  // leader with it.
  json j{{"store", store_ ? store_->kind() : "none"},
         {"leading", !replica_.following()},
         {"leader", replica_.following() ? replica_.leader_hint() : advertised()},
         {"role", region_role_name(cfg_.region.role)}};
  if (replica_.replicated()) j["identity"] = advertised();
  if (!cfg_.region.shard.empty()) j["shard"] = cfg_.region.shard;
  return j;
}

void Manager::register_methods() {
  // Each method with what its caller needs (access.h, Access in manager.h). Operator and
  // admin calls change the cluster and are audited, refusals included.
  static const rpc::Method<Manager> kMethods[] = {
      {"machine.register", &Manager::api_machine_register, kMachineCall},
      {"machine.heartbeat", &Manager::api_machine_heartbeat, kMachineCall},
      {"health.report", &Manager::api_health_report, kMachineCall},
      {"profile.report", &Manager::api_profile_report, kMachineCall},
      {"task.unhealthy", &Manager::api_task_unhealthy, kMachineCall},
      {"entitlement.create", &Manager::api_entitlement_create, kAdminCall},
      {"entitlement.update", &Manager::api_entitlement_update, kAdminCall},
      {"entitlement.rm", &Manager::api_entitlement_rm, kAdminCall},
      {"entitlement.ls", &Manager::api_entitlement_ls, kViewerCall},
      {"entitlement.show", &Manager::api_entitlement_show, kViewerCall},
      {"job.create", &Manager::api_job_create, kOperatorCall},
      {"job.scale", &Manager::api_job_scale, kOperatorCall},
      {"job.update", &Manager::api_job_update, kOperatorCall},
      {"job.stop", &Manager::api_job_stop, kOperatorCall},
      {"job.ls", &Manager::api_job_ls, kViewerCall},
      {"job.show", &Manager::api_job_show, kViewerCall},
      {"job.autoscale", &Manager::api_job_autoscale, kViewerCall},
      {"job.events", &Manager::api_job_events, kViewerCall},
      {"job.history", &Manager::api_job_history, kViewerCall},
      {"job.revert", &Manager::api_job_revert, kOperatorCall},
      {"job.rollout", &Manager::api_job_rollout, kOperatorCall},
      {"job.autoscale.pause", &Manager::api_job_autoscale_pause, kOperatorCall},
      {"rebalance.plan", &Manager::api_rebalance_plan, kViewerCall},
      {"rebalance.status", &Manager::api_rebalance_status, kViewerCall},
      {"top", &Manager::api_top, kViewerCall},
      {"rebalance.pause", &Manager::api_rebalance_pause, kOperatorCall},
      {"task.ls", &Manager::api_task_ls, kViewerCall},
      {"task.show", &Manager::api_task_show, kViewerCall},
      {"task.signal", &Manager::api_task_signal, kOperatorCall},
      {"task.restart", &Manager::api_task_restart, kOperatorCall},
      // Audited with its command line; its input and output are not calls of their own.
      {"task.exec", &Manager::api_task_exec, kOperatorCall},
      // Its own check (may_read_logs) and audit: logs can hold secrets.
      {"task.logs", &Manager::api_task_logs, kViewerCall},
      {"machine.ls", &Manager::api_machine_ls, kViewerCall},
      {"machine.show", &Manager::api_machine_show, kViewerCall},
      {"machine.drain", &Manager::api_machine_drain, kAdminCall},
      {"machine.rm", &Manager::api_machine_rm, kAdminCall},
      {"machine.assign", &Manager::api_machine_assign, kAdminCall},
      {"machine.release", &Manager::api_machine_release, kAdminCall},
      {"audit.ls", &Manager::api_audit_ls, kViewerCall},
      {"maintenance.schedule", &Manager::api_maintenance_schedule, kAdminCall},
      {"maintenance.ls", &Manager::api_maintenance_ls, kViewerCall},
      {"maintenance.cancel", &Manager::api_maintenance_cancel, kAdminCall},
      {"controlplane.status", &Manager::api_controlplane_status, kViewerCall},
      {"web.page", &Manager::api_web_page, kViewerCall},
      {"service.ls", &Manager::api_service_ls, kViewerCall},
      {"service.show", &Manager::api_service_show, kViewerCall},
      {"service.watch", &Manager::api_service_watch, kViewerCall},
      {"service.interest", &Manager::api_service_interest, kMachineCall},
  };
  server_.methods().add("frontend.forward", [this](const json& p, const CallContext& c) {
    return api_frontend_forward(p, c);
  });
  // task.exec's bytes (exec_relay.h): taken only from the session that started the exec,
  // or from the agent's it runs on; notifications, neither answered nor audited.
  server_.methods().add("task.exec.input", [this](const json& p, const CallContext& c) {
    if (exec_relay_ && c.session) exec_relay_->from_caller(c.session, p);
    return Result<json>(json::object());
  });
  for (const char* m : {"task.exec.output", "task.exec.exit"})
    server_.methods().add(
        m, [this, exit = std::string(m) == "task.exec.exit"](const json& p, const CallContext& c) {
          if (exec_relay_ && c.session) exec_relay_->from_upstream(c.session, p, exit);
          return Result<json>(json::object());
        });
  server_.methods().add(
      "pool.lend", [this](const json& p, const CallContext& c) { return api_pool_lend(p, c); });
  server_.methods().add(
      "pool.return", [this](const json& p, const CallContext& c) { return api_pool_return(p, c); });
  server_.methods().add(
      "region.move", [this](const json& p, const CallContext& c) { return api_region_move(p, c); });
  // What every method goes through: its caller's check, a region's machine that belongs
  // elsewhere sent there, its metrics and (operator and admin calls) its audit entry.
  // `machine`: the machine a machine's call names, if it names one.
  auto guarded = [this](const rpc::Method<Manager>& m, const CallContext& c,
                        const std::string* machine, const json& audited,
                        const std::function<Result<json>()>& handle) -> Result<json> {
    Caller who = caller(c);
    Result<json> r = json();
    // Operator and admin calls are rare and must hear whether their change was
    // written (a full disk refuses the create, nothing half-made): they commit on
    // their own, after the machines' batch so far, not in the next group commit.
    // With etcd they join the group like the machines' calls: a group etcd did not
    // take is never answered (the group commit holds it and writes it again), so the
    // reply still means "written".
    bool own_commit = m.access >= kOperatorCall && !replica_.on_etcd();
    if (own_commit) {
      group_->commit();
      group_->set_sync(true);
    }
    uint64_t t0 = now_us();
    if (auto s = permit(who, m.access, m.name); !s.ok()) {
      r = std::move(s).error();
    } else if (m.access == kMachineCall && region_.lending && machine) {
      // A region's machine that belongs elsewhere is told where (kMoved), and its
      // session ends once it has heard it: its daemon goes there.
      if (auto a = region_.lending->admit(*machine); !a.ok()) {
        if (c.session) c.session->close_when_sent();
        r = std::move(a).error();
      } else {
        r = handle();
      }
    } else {
      r = handle();
    }
    metrics_.request(m.name, static_cast<double>(now_us() - t0) / 1e6, r.ok());
    // The audit entry joins the next group commit; the reply waits for it.
    group_->set_sync(false);
    if (m.access >= kOperatorCall) audit(who, m.name, audited, r);
    return r;
  };
  for (const auto& m : kMethods)
    server_.methods().add(m.name, [this, m, guarded](const json& p, const CallContext& c) {
      const std::string* machine =
          p.is_object() && p.contains("machine") && p["machine"].is_string()
              ? &p["machine"].get_ref<const std::string&>()
              : nullptr;
      return guarded(m, c, machine, p, [&] { return (this->*m.handler)(p, c); });
    });
  // A machine's report every heartbeat: read straight from its text (docs/protocol.md).
  server_.methods().add_raw(
      "machine.report", [this, guarded](std::string_view text, const CallContext& c) {
        static const rpc::Method<Manager> kReport{"machine.report", nullptr, kMachineCall};
        Result<weft::TaskReport> report = weft::parse_task_report(text);
        // A refused report still names its machine (it is alive whatever it says).
        std::string machine = report.ok() ? report->machine : weft::report_machine(text);
        Result<json> r = guarded(kReport, c, machine.empty() ? nullptr : &machine, json(),
                                 [&] { return api_machine_report(machine, std::move(report), c); });
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

Result<json> Manager::api_machine_register(const json& p, const CallContext& c) {
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
  if (auto known = broker_.find(info.id))
    TRY(claim_session(MachineSessions::Daemon::kAgent, *known, c));
  TRY_ASSIGN(MachineId m, broker_.register_machine(info, now_us()));
  TRY(claim_session(MachineSessions::Daemon::kAgent, m, c));
  reports_.lists.erase(m);  // a (re)started agent sends its whole list first
  // Back from a maintenance reboot: the boot id changed.
  std::string boot = p.value("boot_id", std::string());
  reports_.boot_ids[m] = boot;
  for (uint64_t id : maintenance_.registered(info.id, boot, now_realtime_us()))
    group_->unsaved().maintenance.insert(id);
  if (p.contains("controllers")) reports_.controllers[m] = p["controllers"];
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
    reports_.running_means_ready.erase(m);
  else
    reports_.running_means_ready.insert(m);
  TRY(persist({}, {m}));
  json reply{{"machine", info.id},
             {"profile", broker_.desired_profile(m)},
             {"heartbeat_interval_ms", cfg_.broker.heartbeat_interval_us / 1000},
             // An unchanged machine's heartbeat may come as a notification (docs/protocol.md).
             {"quiet_heartbeats", true}};
  // A region's shard: who holds the machine, and since which epoch (HolderFence).
  if (region_.lending)
    if (json h = region_.lending->holder_of(info.id); !h.is_null()) reply["holder"] = std::move(h);
  return reply;
}

Result<json> Manager::api_machine_heartbeat(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  TRY(claim_session(MachineSessions::Daemon::kAgent, m, c));
  TRY(broker_.heartbeat(p["machine"].get<std::string>(), now_us()));
  return json{{"profile", broker_.desired_profile(m)}};
}

Result<json> Manager::api_machine_report(const std::string& machine,
                                         Result<weft::TaskReport> parsed, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(machine, c));
  TRY(claim_session(MachineSessions::Daemon::kAgent, m, c));
  // The machine is alive whatever its report says: a report refused below (a state this
  // version does not know, from a newer agent) must not get its tasks declared lost.
  (void)broker_.heartbeat(machine, now_us());
  TRY_ASSIGN(weft::TaskReport report, std::move(parsed));
  MachineReports::TaskListSeen& last = reports_.lists[m];
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
  if (reports_.running_means_ready.count(m)) {
    auto ready = [](TaskState s) { return s == TaskState::kRunning ? TaskState::kReady : s; };
    if (whole) {
      cmds = sched_.report_list(m, last.tasks, now, &forget, &report.failures, true);
    } else {
      for (auto& e : applied)
        if (e.second) e.second = ready(*e.second);
      cmds = sched_.report_changes(m, applied, now, &forget, &report.failures);
    }
  } else {
    cmds = whole ? sched_.report_list(m, last.tasks, now, &forget, &report.failures)
                 : sched_.report_changes(m, applied, now, &forget, &report.failures);
  }
  auto changed = sched_.take_reported_changes();
  if (!cmds.empty() || !changed.empty())
    TRY(persist({}, {}));  // tasks; the machine row is as it was
  send(cmds);
  for (const auto& job : changed)  // controllers hear of their tasks' changes at once
    if (control_) control_->ask(job);
  // Ended tasks whose end is now durable here: the machine stops reporting them, so a
  // report stays the size of what the machine runs.
  return json{{"commands", cmds.size()}, {"forget", forget}};
}

Result<json> Manager::api_health_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
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
  std::string before = broker_.state_of(m);
  TRY(broker_.health(p["machine"].get<std::string>(), p["verdict"].get<std::string>(), now_us()));
  sessions_.track_hcs(m, c.session);
  reports_.problems[m] = std::move(problems);
  // A machine that failed has its tasks replaced now, and one that became healthy
  // takes what waited for it, not at the next tick; an unchanged verdict (every
  // heartbeat) costs nothing more.
  if (broker_.state_of(m) != before) kick();
  // hcs reports a changed verdict at once; otherwise a keepalive at this interval.
  return json{{"heartbeat_interval_ms", keepalive_us() / 1000}};
}

Result<json> Manager::api_profile_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
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
  if (p.contains("profiles")) reports_.profiles_offered[m] = std::move(offered);
  bool changed = broker_.persisted(m).applied_profile != p["profile"].get<std::string>();
  TRY(broker_.profile_applied(p["machine"].get<std::string>(), p["profile"].get<std::string>()));
  reports_.profile_state[m] = p.value("state", "");
  pool_changes_.reported(m);  // the reply carries the desired profile
  if (changed) {              // a report every heartbeat writes and schedules nothing
    TRY(persist({}, {m}));
    kick();
  }
  // Sidekick reports a switch at once; otherwise a keepalive at this interval.
  return json{{"desired", broker_.desired_profile(m)},
              {"heartbeat_interval_ms", keepalive_us() / 1000}};
}

Result<json> Manager::api_entitlement_create(const json& p, const CallContext& c) {
  // A shard acts only for the entitlements the region gave it: a front end claims the
  // entitlement's home in etcd before it carries the create here (docs/regions.md).
  if (cfg_.region.role == RegionRole::kBroker)
    return make_error(
               "this control plane is a region's broker: it holds machines, not "
               "entitlements (create them through a front end)")
        .with_code(rpc::kUnsupported);
  if (cfg_.region.role == RegionRole::kShard && c.peer.via.empty())
    return make_error("this control plane is shard " + cfg_.region.shard +
                      " of a region: entitlements are created through a front end, which "
                      "gives each one its shard (docs/regions.md)")
        .with_code(rpc::kUnsupported);
  EntitlementSpec e;
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  e.name = p["name"].get<std::string>();
  if (!weft::valid_entitlement_name(e.name))
    return field_error("name",
                       "an entitlement's name is 1-64 letters, digits, '-' and '_', starting with "
                       "a letter or digit");
  if (!p.contains("quota") || !p["quota"].is_number_unsigned())
    return field_error("quota", "must be a number of machines");
  e.quota = p["quota"].get<size_t>();
  for (auto [key, out] : {std::pair{"profile", &e.profile}, {"dc", &e.dc}}) {
    if (p.contains(key) && !p[key].is_string()) return field_error(key, "must be a string");
    if (p.contains(key)) *out = p[key].get<std::string>();
  }
  if (!e.profile.empty()) TRY(check_profile(e.profile));
  TRY(check_machine_name("dc", e.dc, false));
  if (p.contains("owners")) {
    TRY_ASSIGN(e.owners, owners_from(p["owners"]));
  }
  if (p.contains("grants")) {
    TRY_ASSIGN(e.grants, parse_task_grants(p["grants"], cfg_.socket_group));
  }
  if (cfg_.region.role == RegionRole::kShard) {
    // The front end's word is checked: the home it claimed must be in etcd, this shard's
    // (issue 59: a forwarded create made an entitlement with no home, or another's).
    if (!region_.checks || !c.session)
      return make_error("this shard cannot check the entitlement's home now")
          .with_code(rpc::kUnavailable);
    rpc::ReplyFn reply = c.session->defer_reply();
    region_.checks->home_is_mine(e.name, [this, e, reply](Status s) {
      if (!s.ok()) return reply(std::move(s).error());
      reply(create_entitlement(e));
    });
    return json();
  }
  return create_entitlement(e);
}

Result<json> Manager::create_entitlement(const EntitlementSpec& e) {
  TRY_ASSIGN(EntitlementId id, broker_.create_entitlement(e));
  if (auto s = persist({}, {}); !s.ok()) {
    broker_.forget_entitlement(id);  // not durable: not created
    return std::move(s).error();
  }
  return json{{"id", id}, {"name", e.name}};
}

Result<json> Manager::api_entitlement_update(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  auto id = broker_.entitlement(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  if (!p.contains("owners") && !p.contains("grants") && !p.contains("quota") &&
      !p.contains("profile"))
    return field_error("owners", "owners, grants, quota or profile is required");
  // Everything checked before anything is changed: nothing half-applied.
  std::optional<std::vector<std::string>> owners;
  std::optional<TaskGrants> grants;
  std::optional<size_t> quota;
  std::optional<std::string> profile;
  if (p.contains("owners")) {
    TRY_ASSIGN(owners, owners_from(p["owners"]));
  }
  if (p.contains("grants")) {
    TRY_ASSIGN(grants, parse_task_grants(p["grants"], cfg_.socket_group));
  }
  if (p.contains("quota")) {
    TRY_ASSIGN(const int64_t q, int_member(p, "quota", 0, 1, 1'000'000));
    TRY(check_quota(*id, static_cast<size_t>(q)));
    quota = static_cast<size_t>(q);
  }
  if (p.contains("profile")) {
    if (!p["profile"].is_string()) return field_error("profile", "must be a profile name");
    profile = p["profile"].get<std::string>();
    if (!profile->empty()) TRY(check_profile(*profile));
  }
  TRY_ASSIGN(const int64_t pace, int_member(p, "max_unavailable", 1, 1, 10'000));
  // Jobs already running keep their tasks under narrower grants (no task is stopped for
  // it); their next update is checked against the new grants.
  const EntitlementSpec before = broker_.entitlement_spec(*id);
  if (owners) broker_.set_owners(*id, *owners);
  if (grants) broker_.set_grants(*id, *grants);
  if (quota) broker_.set_quota(*id, *quota);
  bool roll = profile && *profile != before.profile;
  if (roll) broker_.set_profile(*id, *profile);
  if (auto s = persist({}, {}); !s.ok()) {
    broker_.set_owners(*id, before.owners);  // not durable: not changed
    broker_.set_grants(*id, before.grants);
    broker_.set_quota(*id, before.quota);
    broker_.set_profile(*id, before.profile);
    return std::move(s).error();
  }
  if (quota && *quota < before.quota) {
    // Idle machines beyond the new quota go back to the free pool now.
    std::vector<MachineId> freed = alloc_.shrink(*id);
    if (!freed.empty()) TRY(persist({}, {freed.begin(), freed.end()}));
  }
  if (roll) {
    profile_rolls_.start(*id, before.profile, static_cast<size_t>(pace));
    advance_profile_rolls();
  }
  const EntitlementSpec& now = broker_.entitlement_spec(*id);
  json j = entitlement_json(*id, now);
  j["machines"] = alloc_.pool_size(*id);
  if (roll) j["profile_roll"] = profile_roll_json(*id);
  return j;
}

Result<json> Manager::api_audit_ls(const json& p, const CallContext&) {
  TRY_ASSIGN(int64_t since, int_member(p, "since_wall_us", 0, 0, INT64_MAX));
  TRY_ASSIGN(int64_t limit, int_member(p, "limit", 1000, 1, 100'000));
  TRY_ASSIGN(auto rows, store_->audit(since, static_cast<size_t>(limit)));
  json arr = json::array();
  for (const auto& a : rows)
    arr.push_back({{"seq", a.seq},
                   {"at_wall_us", a.at_wall_us},
                   {"who", a.who},
                   {"role", a.role},
                   {"method", a.method},
                   {"target", a.target},
                   {"params_sha256", a.digest},
                   {"result", a.result}});
  return json{{"entries", arr}};
}

Result<json> Manager::api_entitlement_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& [id, e] : broker_.entitlements()) {
    json j = entitlement_json(id, e);
    j["machines"] = alloc_.pool_size(id);
    arr.push_back(std::move(j));
  }
  return json{{"entitlements", arr}};
}

Result<json> Manager::api_rebalance_plan(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the entitlement's name");
  auto id = broker_.entitlement(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  std::string planner = "local";
  if (p.contains("planner")) {
    if (!p["planner"].is_string() || (p["planner"] != "local" && p["planner"] != "exact"))
      return field_error("planner", "must be \"local\" (the default) or \"exact\"");
    planner = p["planner"].get<std::string>();
  }
  rebalance::Options o;
  // The plan is made on the loop: the exact planner is held to 200 ms and 8 machines
  // (an operator's request; the loop's heartbeats wait at most that), the local search
  // takes milliseconds. A ReBalancer that plans continuously runs the solver off the
  // loop (docs/decisions.md).
  o.time_limit_us = 200'000;
  o.neighbourhood = 8;
  if (p.contains("budget")) {
    const json& b = p["budget"];
    if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > 10000)
      return field_error("budget", "must be an integer of moves from 1 to 10000");
    o.move_budget = b.get<size_t>();
  }
  json out =
      rebalance_plan_json(rebalance_snapshot(alloc_, sched_, *id, broker_.entitlement_spec(*id).dc),
                          o, planner == "exact");
  out["entitlement"] = p["name"];
  return out;
}

Result<json> Manager::api_top(const json& p, const CallContext& c) {
  TRY_ASSIGN(TopQuery q, parse_top_query(p));
  if (!agent_asks_) return make_error("not leading").with_code(rpc::kUnavailable);
  if (!c.session) return make_error("top is served on sessions only");
  auto reply = c.session->defer_reply();
  // At most 3 s: a machine that has not answered by then is named, not waited for.
  agent_asks_->usage(top_asks(q, alloc_, sched_), 3'000'000, [this, q, reply](AgentAsks::Answer a) {
    reply(top_json(q, a, alloc_, sched_));
  });
  return json();
}

Result<json> Manager::api_rebalance_status(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the entitlement's name");
  auto id = broker_.entitlement(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  if (!rebalancer_)
    return make_error("the ReBalancer is off here ([rebalancer] enabled = false)")
        .with_code(rpc::kUnavailable);
  const EntitlementSpec& e = broker_.entitlement_spec(*id);
  return rebalancer_->status({*id, e.name, e.rebalance_paused, e.dc});
}

Result<json> Manager::api_rebalance_pause(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the entitlement's name");
  if (!p.contains("paused") || !p["paused"].is_boolean())
    return field_error("paused", "is required: true to pause, false to resume");
  auto id = broker_.entitlement(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  TRY(may_change_jobs(caller(c), *id));
  const bool paused = p["paused"].get<bool>();
  const bool before = broker_.set_rebalance_paused(*id, paused);
  if (auto s = persist({}, {}); !s.ok()) {
    broker_.set_rebalance_paused(*id, before);  // not durable: not changed
    return std::move(s).error();
  }
  return json{{"entitlement", p["name"]}, {"paused", paused}};
}

Result<json> Manager::api_entitlement_show(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  auto id = broker_.entitlement(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  const auto& e = broker_.entitlement_spec(*id);
  json machines = json::array(), jobs = json::array();
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == *id) machines.push_back(machine_json(m));
  for (const auto& j : sched_.persisted_jobs())
    if (j.spec.entitlement_id == *id) jobs.push_back(j.spec.name);
  json j = entitlement_json(*id, e);
  j["machines"] = std::move(machines);
  j["jobs"] = std::move(jobs);
  if (profile_rolls_.rolling(*id)) j["profile_roll"] = profile_roll_json(*id);
  if (region_.moves)
    if (json m = region_.moves->status(*id); !m.is_null()) j["moving"] = std::move(m);
  return j;
}

Result<json> Manager::resolve_image_then(const json& p, const CallContext& c, JobCall next) {
  // Checked whole first: a bad job or a caller without the right is refused before any
  // registry is asked.
  TRY_ASSIGN(JobSpec spec, job_from_params(p));
  TRY(may_change_jobs(caller(c), spec.entitlement_id));
  const json& image = p["task"]["image"];
  TRY_ASSIGN(oci::ImageRef ref, oci::parse_image_ref(image.get<std::string>()));
  if (!registry_) {
    TRY_ASSIGN(auto client, registry::Client::create(*loop_, cfg_.registry));
    registry_ = std::move(client);
  }
  if (!c.session) return field_error("task.image", "needs a digest on this connection");
  rpc::ReplyFn reply = c.session->defer_reply();
  rpc::Peer peer = c.peer;
  json params = p;
  registry_->manifest(ref, [this, reply, peer, params, ref,
                            next](Result<registry::FetchedManifest> m) mutable {
    if (!m.ok()) {
      Error e = field_error("task.image", "cannot resolve " + ref.str() + ": " + m.error().str());
      return reply(e);
    }
    // What every agent would refuse (more layers than overlayfs stacks, a malformed
    // manifest) is refused here, by the agents' own reader, not after placement.
    if (auto doc = oci::parse_manifest(m->bytes, m->media_type); !doc.ok())
      return reply(field_error("task.image", ref.str() + ": " + doc.error().str()));
    // The answer came after this replica stopped leading: nothing is written here (the
    // caller retries at the leader, which resolves the tag again).
    if (replica_.following())
      return reply(make_error("this control plane stopped leading while resolving the image")
                       .with_code(rpc::kNotLeader));
    oci::ImageRef pinned = ref;
    pinned.digest = m->digest;
    params["task"]["image"] = pinned.str();
    log_info("image tag resolved", {{"IMAGE", ref.str()}, {"DIGEST", m->digest.str()}});
    reply((this->*next)(params, CallContext{nullptr, peer}));
  });
  return json();
}

namespace {

// A job's task that names an image by tag only (no digest).
bool image_needs_resolution(const json& p) {
  if (!p.is_object() || !p.contains("task") || !p["task"].is_object()) return false;
  const json& t = p["task"];
  if (!t.contains("image") || !t["image"].is_string()) return false;
  auto ref = oci::parse_image_ref(t["image"].get<std::string>());
  return ref.ok() && !ref->digest;
}

}  // namespace

Result<json> Manager::api_job_create(const json& p, const CallContext& c) {
  if (image_needs_resolution(p)) return resolve_image_then(p, c, &Manager::job_create_resolved);
  return job_create_resolved(p, c);
}

Result<json> Manager::job_create_resolved(const json& p, const CallContext& c) {
  TRY_ASSIGN(JobSpec spec, job_from_params(p));
  TRY(may_change_jobs(caller(c), spec.entitlement_id));
  TRY_ASSIGN(auto cmds, sched_.create(spec, now_us()));
  sched_.note_revision(spec.name, "created by " + caller(c).who);
  // A periodic job's first period is the first after now.
  if (spec.periodic)
    sched_.skip_period(spec.name, static_cast<int64_t>(now_realtime_us() / 1'000'000), "");
  // The job's row and its tasks' (a machine's row changes only when the machine changes
  // pool, which the allocator reports itself: not one row per machine it placed on).
  if (auto s = persist({spec.name}, {}); !s.ok()) {
    sched_.abandon(spec.name);  // not durable: not created, nothing was sent
    return std::move(s).error();
  }
  send(cmds);
  return json{{"job", spec.name}, {"tasks", cmds.size()}};
}

Result<json> Manager::job_op(const std::string& op, const json& p, const CallContext& c,
                             const std::string& note) {
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  std::string name = p["name"].get<std::string>();
  Caller who = caller(c);
  if (auto current = sched_.job(name)) TRY(may_change_jobs(who, current->entitlement_id));
  Result<std::vector<Command>> cmds = make_error("unknown operation");
  if (op == "scale") {
    const json& count = p.contains("count") ? p["count"] : json();
    if (!count.is_number_integer() || count.get<int64_t>() < 1 ||
        count.get<int64_t>() > kMaxTasksPerJob ||
        (count.is_number_unsigned() && count.get<uint64_t>() > kMaxTasksPerJob))
      return field_error("count",
                         "must be an integer from 1 to " + std::to_string(kMaxTasksPerJob));
    cmds = sched_.scale(name, static_cast<int>(count.get<int64_t>()), now_us());
  } else if (op == "update") {
    TRY_ASSIGN(JobSpec spec, job_from_params(p));
    TRY(may_change_jobs(who, spec.entitlement_id));  // the entitlement it moves to, too
    cmds = sched_.update(spec, now_us());
    if (cmds.ok()) sched_.note_revision(name, note.empty() ? "updated by " + who.who : note);
  } else {
    cmds = sched_.stop(name, now_us());
  }
  if (!cmds.ok()) return cmds.error();
  TRY(persist({name}, {}));
  send(*cmds);
  if (op == "update") {
    if (control_) control_->round();  // a new controller, or new operations: at once
  }
  return json{{"job", name}, {"commands", cmds->size()}};
}

Result<json> Manager::api_job_scale(const json& p, const CallContext& c) {
  return job_op("scale", p, c);
}

Result<json> Manager::api_job_update(const json& p, const CallContext& c) {
  if (image_needs_resolution(p)) return resolve_image_then(p, c, &Manager::job_update_resolved);
  return job_op("update", p, c);
}

Result<json> Manager::job_update_resolved(const json& p, const CallContext& c) {
  return job_op("update", p, c);
}

Result<json> Manager::api_job_stop(const json& p, const CallContext& c) {
  return job_op("stop", p, c);
}

Result<json> Manager::api_job_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& j : sched_.persisted_jobs()) {
    int running = 0, ready = 0, current = 0;
    for (const TaskRecord* t : sched_.task_refs_of(j.spec.name)) {
      running += t->state == TaskState::kRunning;
      ready += available(*t);
      current += available(*t) && t->generation == j.generation;
    }
    json row{{"name", j.spec.name},
             {"count", j.spec.count},
             {"running", running},
             {"ready", ready},
             {"current", current},
             {"generation", j.generation},
             {"entitlement", j.spec.entitlement},
             {"stopping", j.stopping}};
    if (j.spec.is_batch()) {
      row["kind"] = j.spec.periodic ? "periodic" : "batch";
      row["completions"] = j.spec.batch.completions;
      row["succeeded"] = j.progress.succeeded;
      row["failed"] = j.progress.failed;
      row["outcome"] = j.progress.outcome;
    }
    arr.push_back(std::move(row));
  }
  return json{{"jobs", arr}};
}

Result<json> Manager::api_job_events(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  const std::string name = p["name"].get<std::string>();
  TRY_ASSIGN(const int64_t after, int_member(p, "after", 0, 0, INT64_MAX));
  TRY_ASSIGN(const int64_t limit, int_member(p, "limit", 100, 1, 1000));
  take_events();  // what happened up to now
  uint64_t next = 0;
  auto events =
      job_events_.list(name, static_cast<uint64_t>(after), static_cast<size_t>(limit), &next);
  if (events.empty() && !sched_.job(name) && after == 0)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  json out = json::array();
  for (const auto& e : events) out.push_back(JobEvents::to_json(e));
  return json{{"job", name}, {"events", out}, {"next", next}};
}

Result<json> Manager::api_job_history(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  std::string name = p["name"].get<std::string>();
  auto spec = sched_.job(name);
  auto progress = sched_.progress(name);
  if (!spec || !progress)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  bool may_see_secrets = may_change_jobs(caller(c), spec->entitlement_id).ok();
  uint64_t now = now_us();
  int64_t wall = static_cast<int64_t>(now_realtime_us());
  json revs = json::array();
  for (const auto& r : progress->revisions) {
    json shown = r.spec;
    if (!may_see_secrets) hide_secrets(shown);
    revs.push_back(
        {{"generation", r.generation},
         {"at", format_rfc3339(wall - static_cast<int64_t>(now > r.at_us ? now - r.at_us : 0))},
         {"note", r.note},
         {"spec", shown}});
  }
  return json{{"job", name},
              {"generation", sched_.generation(name)},
              {"paused", progress->paused},
              {"canary", progress->canary},
              {"revisions", revs}};
}

Result<json> Manager::api_job_revert(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  std::string name = p["name"].get<std::string>();
  TRY_ASSIGN(const int64_t gen, int_member(p, "generation", 0, 1, INT64_MAX));
  if (gen == 0) return field_error("generation", "is required: the revision to go back to");
  return revert_to(name, static_cast<uint64_t>(gen),
                   "revert to generation " + std::to_string(gen) + " by " + caller(c).who, c);
}

Result<json> Manager::revert_to(const std::string& name, uint64_t gen, const std::string& note,
                                const CallContext& c) {
  auto progress = sched_.progress(name);
  auto current = sched_.job(name);
  if (!progress || !current)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  TRY(may_change_jobs(caller(c), current->entitlement_id));
  const Revision* rev = nullptr;
  for (const auto& r : progress->revisions)
    if (r.generation == gen) rev = &r;
  if (!rev)
    return field_error("generation", "job " + name + " keeps no revision " + std::to_string(gen) +
                                         " (weftctl job history " + name + ")")
        .with_code(rpc::kNotFound);
  // A rolling update to that spec (its own validation and grants), without a canary
  // phase: a revert rolls to every task. The job's size stays what it is now.
  json params = rev->spec;
  params["name"] = name;
  if (!current->is_batch()) params["count"] = current->count;
  TRY_ASSIGN(json r, job_op("update", params, c, note));
  if (sched_.progress(name).value_or(JobProgress{}).canary) {
    TRY_ASSIGN(auto cmds, sched_.promote(name, now_us(), note));
    TRY(persist({name}, {}));
    send(cmds);
  }
  r["generation"] = sched_.generation(name);
  r["reverted_to"] = gen;
  return r;
}

Result<json> Manager::api_job_rollout(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  if (!p.contains("action") || !p["action"].is_string())
    return field_error("action", "is required: pause, resume, abort or promote");
  std::string name = p["name"].get<std::string>(), action = p["action"].get<std::string>();
  auto spec = sched_.job(name);
  auto progress = sched_.progress(name);
  if (!spec || !progress)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  TRY(may_change_jobs(caller(c), spec->entitlement_id));
  std::string who = caller(c).who;
  if (action == "abort") {
    // Back to the revision before the current one, at once and whole.
    const auto& revs = progress->revisions;
    uint64_t gen = sched_.generation(name);
    const Revision* before = nullptr;
    for (const auto& r : revs)
      if (r.generation < gen) before = &r;
    if (!before)
      return field_error("name", "job " + name + " has no earlier revision to go back to")
          .with_code(rpc::kConflict);
    return revert_to(name, before->generation,
                     "rollout of generation " + std::to_string(gen) + " aborted by " + who, c);
  }
  Result<std::vector<Command>> cmds = make_error("unknown");
  if (action == "pause" || action == "resume")
    cmds = sched_.pause_rollout(name, action == "pause", now_us());
  else if (action == "promote")
    cmds = sched_.promote(name, now_us(), "promoted by " + who);
  else
    return field_error("action", "must be pause, resume, abort or promote");
  if (!cmds.ok()) return cmds.error();
  TRY(persist({name}, {}));
  send(*cmds);
  if (control_) control_->round();
  auto now = sched_.progress(name).value_or(JobProgress{});
  return json{
      {"job", name}, {"paused", now.paused}, {"canary", now.canary}, {"commands", cmds->size()}};
}

Result<json> Manager::api_job_autoscale(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  std::string name = p["name"].get<std::string>();
  auto spec = sched_.job(name);
  if (!spec) return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  if (!spec->autoscale) return field_error("name", "job " + name + " does not autoscale");
  auto shown = autoscaling_ ? autoscaling_->show(name) : std::nullopt;
  if (!shown) return make_error("autoscaling is not running here").with_code(rpc::kUnavailable);
  return *shown;
}

Result<json> Manager::api_job_autoscale_pause(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  if (!p.contains("paused") || !p["paused"].is_boolean())
    return field_error("paused", "is required: true to pause, false to resume");
  std::string name = p["name"].get<std::string>();
  auto spec = sched_.job(name);
  if (!spec) return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  TRY(may_change_jobs(caller(c), spec->entitlement_id));
  if (!spec->autoscale) return field_error("name", "job " + name + " does not autoscale");
  AutoscaleSpec a = *spec->autoscale;
  a.paused = p["paused"].get<bool>();
  TRY(sched_.set_autoscale(name, a));
  TRY(persist({name}, {}));
  return json{{"job", name}, {"paused", a.paused}};
}

Result<json> Manager::api_job_show(const json& p, const CallContext& c) {
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  auto spec = sched_.job(p["name"].get<std::string>());
  if (!spec) return field_error("name", "no such job").with_code(rpc::kNotFound);
  json tasks = json::array();
  for (const auto& t : sched_.tasks_of(spec->name)) tasks.push_back(task_json(t, alloc_));
  json shown = weft::to_json(*spec);
  // The environment carries secrets: shown to those who may change the job only.
  if (!may_change_jobs(caller(c), spec->entitlement_id).ok()) hide_secrets(shown);
  // The network its tasks get (a job stored before "own" was the default has none
  // written: the host's, until its next update).
  std::string network = "host";
  if (const json& t = spec->task;
      t.is_object() && t.contains("namespaces") && t["namespaces"].is_object() &&
      t["namespaces"].contains("network") && t["namespaces"]["network"].is_string())
    network = t["namespaces"]["network"].get<std::string>();
  static const std::map<std::string, std::string> kNetworks = {
      {"own",
       "a namespace of each task's own: the machine's bridge where it has one, else "
       "private (only loopback)"},
      {"bridge", "an address on the machine's bridge, ports published on its address"},
      {"private", "a namespace with only loopback"},
      {"host", "the machine's own network (a grant: host_network)"}};
  json out{{"spec", shown},
           {"entitlement", spec->entitlement},
           {"generation", sched_.generation(spec->name)},
           {"network", network},
           {"network_detail", kNetworks.count(network) ? kNetworks.at(network) : ""},
           {"tasks", tasks}};
  if (spec->is_batch()) out[spec->periodic ? "periodic" : "batch"] = batch_json(spec->name, *spec);
  if (spec->controller) {
    json ops = json::array();
    for (const auto& op : sched_.pending_operations(spec->name)) ops.push_back(op.id);
    out["task_controller"] = {
        {"address", spec->controller->job.empty() ? spec->controller->address
                                                  : controller_address(*spec->controller)},
        {"unreachable", control_ && control_->unreachable(spec->name)},
        {"fallback", sched_.control_fallback(spec->name)},
        {"pending", ops}};
    if (!spec->controller->job.empty()) {
      out["task_controller"]["job"] = spec->controller->job;
      out["task_controller"]["port"] = spec->controller->port;
    }
  }
  return out;
}

json Manager::batch_json(const std::string& name, const JobSpec& spec) {
  JobProgress p = sched_.progress(name).value_or(JobProgress{});
  uint64_t now = now_us();
  int64_t wall = static_cast<int64_t>(now_realtime_us());
  auto at = [&](uint64_t mono) {
    return format_rfc3339(wall + (static_cast<int64_t>(mono) - static_cast<int64_t>(now)));
  };
  if (spec.periodic) {
    int64_t wall_s = wall / 1'000'000;
    json runs = json::array();
    auto live = sched_.periodic_jobs();
    std::vector<std::string> all = sched_.ended_runs(name);
    if (auto it = live.find(name); it != live.end())
      all.insert(all.end(), it->second.begin(), it->second.end());
    for (const auto& run : all) {
      auto rp = sched_.progress(run).value_or(JobProgress{});
      runs.push_back({{"job", run},
                      {"outcome", rp.outcome.empty() ? "running" : rp.outcome},
                      {"succeeded", rp.succeeded},
                      {"failed", rp.failed}});
    }
    json out{{"schedule", spec.periodic->schedule},
             {"overlap", weft::overlap_name(spec.periodic->overlap)},
             {"runs", runs}};
    if (p.last_period) out["last_period"] = format_rfc3339(p.last_period * 1'000'000);
    if (auto next = periodic_.next_period(sched_, name, std::max(wall_s, p.last_period)))
      out["next_period"] = format_rfc3339(*next * 1'000'000);
    return out;
  }
  json out{{"completions", spec.batch.completions},
           {"parallelism", spec.count},
           {"max_failures", spec.batch.max_failures},
           {"succeeded", p.succeeded},
           {"failed", p.failed},
           {"outcome", p.outcome.empty() ? "running" : p.outcome},
           {"reason", p.reason}};
  if (p.started_us) out["started"] = at(p.started_us);
  if (p.ended_us) out["ended"] = at(p.ended_us);
  if (spec.batch.deadline_us && p.started_us)
    out["deadline"] = at(p.started_us + spec.batch.deadline_us);
  if (!p.parent.empty()) out["periodic_job"] = p.parent;
  return out;
}

Result<json> Manager::api_task_ls(const json&, const CallContext&) {
  std::vector<const TaskRecord*> all;
  all.reserve(sched_.tasks().size());
  for (const auto& [id, t] : sched_.tasks()) all.push_back(&t);
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->id < b->id; });
  json arr = json::array();
  for (const TaskRecord* t : all) arr.push_back(task_json(*t, alloc_));
  return json{{"tasks", arr}};
}

// Pages of `limit` machines (default 500, at most 1000) in the order they first
// registered, from the one after `after`: a reply stays far below the line limit
// however large the fleet. `next` names the last machine of a page that is not the last.
Result<json> Manager::api_machine_ls(const json& p, const CallContext&) {
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
    auto m = broker_.find(p["after"].get<std::string>());
    if (!m) return field_error("after", "no such machine");
    from = *m + 1;
  }
  json arr = json::array();
  MachineId m = from;
  for (; m < alloc_.machine_count() && arr.size() < limit; ++m) {
    if (broker_.removed(m)) continue;
    arr.push_back(machine_json(m));
  }
  json out{{"machines", arr}};
  while (m < alloc_.machine_count() && broker_.removed(m)) ++m;
  if (m < alloc_.machine_count() && !arr.empty()) out["next"] = arr.back()["machine"];
  return out;
}

Result<json> Manager::api_machine_show(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  json j = machine_json(m);
  json tasks = json::array();
  for (const auto& t : sched_.tasks_on(m)) tasks.push_back(task_json(t, alloc_));
  j["task_list"] = tasks;
  json events = json::array();
  for (const auto& e : broker_.events())
    if (e.machine == j["machine"])
      events.push_back({{"at_us", e.at_us}, {"kind", e.kind}, {"detail", e.detail}});
  j["events"] = events;
  return j;
}

Result<json> Manager::api_machine_drain(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  if (p.contains("drained") && !p["drained"].is_boolean())
    return field_error("drained", "must be true or false");
  bool drained = p.value("drained", true);
  TRY(broker_.drain(p["machine"].get<std::string>(), drained, now_us()));
  std::vector<Command> cmds;
  if (drained)
    cmds = sched_.machine_drain(m, now_us());
  else
    sched_.machine_undrained(m);
  TRY(persist({}, {m}));  // with the tasks the drain changed and their jobs
  send(cmds);
  kick();
  return json{{"machine", p["machine"]}, {"drained", drained}};
}

// A machine that is gone for good leaves the listings: only a dead one whose tasks
// have all moved. Registering again brings it back.
Result<json> Manager::api_machine_rm(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  if (int n = alloc_.tasks_on(m); n > 0 && !broker_.removed(m))
    return field_error("machine", "machine " + p["machine"].get<std::string>() + " still holds " +
                                      std::to_string(n) +
                                      " tasks (their replacements wait for the failure budget, "
                                      "or it is not dead)");
  TRY(forget_machine(m));
  return json{{"machine", p["machine"]}, {"removed", true}};
}

Status Manager::forget_machine(MachineId m, const char* left_for) {
  TRY(broker_.remove(alloc_.spec(m).name, now_us(), left_for));
  EntitlementId before = alloc_.entitlement_of(m);
  if (before != kFreePool) TRY(alloc_.assign(m, kFreePool));
  reports_.forget(m);
  pool_changes_.forget(m);
  if (auto s = persist({}, {m}); !s.ok()) {
    broker_.set_removed(m, false);  // not durable: not removed
    if (before != kFreePool) (void)alloc_.assign(m, before);
    return std::move(s).error();
  }
  return {};
}

}  // namespace weft::cp
