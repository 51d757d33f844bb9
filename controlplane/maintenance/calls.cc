// The control plane's side of planned maintenance (controlplane/maintenance/maintenance.h): the
// maintenance.* methods, and the World through which events drain, stop, reboot and
// return machines.
#include "controlplane/maintenance/calls.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

MaintenanceCalls::MaintenanceCalls(const ShardParts& s)
    : model_(s.model), maintenance_(s.maintenance), group_(s.group), clocks_(s.clocks), fx_(s.fx) {}

Maintenance::World MaintenanceCalls::maintenance_world(std::vector<Command>* cmds,
                                                       std::set<MachineId>* touched) {
  Maintenance::World w;
  w.machines_of = [this](const MaintenanceEvent& e) {
    std::vector<std::string> out;
    for (MachineId m = 0; m < model_.alloc.machine_count(); ++m) {
      const MachineInfo info = model_.broker.persisted(m).info;
      const std::string& key = e.target_kind == "machine"  ? info.id
                               : e.target_kind == "domain" ? info.domain
                                                           : info.dc;
      if (key == e.target) out.push_back(info.id);
    }
    return out;
  };
  w.is_drained = [this](const std::string& name) {
    auto m = model_.broker.find(name);
    return m && model_.broker.persisted(*m).drained;
  };
  w.set_drained = [this, cmds, touched](const std::string& name, bool on) {
    auto m = model_.broker.find(name);
    if (!m || !model_.broker.drain(name, on, now_us()).ok()) return;
    touched->insert(*m);
    if (on) {
      auto c = model_.sched.moves().machine_drain(*m, now_us());
      cmds->insert(cmds->end(), c.begin(), c.end());
    } else {
      model_.sched.moves().machine_undrained(*m);
    }
    log_info(on ? "maintenance: machine drained" : "maintenance: machine back in service",
             {{"MACHINE", name}});
  };
  w.evict = [this, cmds](const std::string& name) {
    if (auto m = model_.broker.find(name)) {
      auto c = model_.sched.moves().machine_evict(*m, now_us());
      if (!c.empty())
        log_info("maintenance deadline: stopping what is left on the machine",
                 {{"MACHINE", name}, {"COMMANDS", std::to_string(c.size())}});
      cmds->insert(cmds->end(), c.begin(), c.end());
    }
  };
  w.empty = [this](const std::string& name) {
    auto m = model_.broker.find(name);
    if (!m) return true;
    for (const auto& t : model_.sched.tasks().on(*m))
      if (t.state == TaskState::kStarting || t.state == TaskState::kRunning ||
          t.state == TaskState::kStopping || t.state == TaskState::kDraining)
        return false;
    return true;
  };
  w.healthy = [this](const std::string& name) {
    auto m = model_.broker.find(name);
    return m && model_.broker.healthy(*m) && model_.sessions.agent(*m) != nullptr;
  };
  w.reboot = [this](const std::string& name) {
    auto m = model_.broker.find(name);
    if (!m) return false;
    rpc::Session* sidekick = model_.sessions.sidekick(*m);
    if (!sidekick) return false;
    std::string reasons;
    for (const auto* e : maintenance_.affecting(name))
      reasons += (reasons.empty() ? "" : "; ") + ("maintenance " + std::to_string(e->id) +
                                                  (e->reason.empty() ? "" : ": " + e->reason));
    log_info("maintenance: asking the machine to reboot", {{"MACHINE", name}});
    sidekick->call("machine.reboot", {{"reason", reasons}}, [this, name](Result<json> r) {
      if (r.ok()) return;
      log_warn("maintenance: the machine did not accept the reboot",
               {{"MACHINE", name}, {"ERROR", r.error().str()}});
      for (uint64_t id : maintenance_.reboot_refused(name, r.error().message, now_realtime_us()))
        group_->unsaved().maintenance.insert(id);  // written by the next round
    });
    return true;
  };
  w.boot_id = [this](const std::string& name) {
    auto m = model_.broker.find(name);
    auto it = m ? model_.reports.boot_ids.find(*m) : model_.reports.boot_ids.end();
    return it == model_.reports.boot_ids.end() ? std::string() : it->second;
  };
  return w;
}

void MaintenanceCalls::maintenance_round() {
  std::vector<Command> cmds;
  std::set<MachineId> touched;
  auto w = maintenance_world(&cmds, &touched);
  for (uint64_t id : maintenance_.step(w, now_realtime_us()))
    group_->unsaved().maintenance.insert(id);
  if (!group_->unsaved().maintenance.empty() || !cmds.empty() || !touched.empty()) {
    if (auto s = fx_.persist({}, touched); !s.ok())
      log_error("cannot write maintenance state: " + s.error().str());
    else
      fx_.send(cmds);
    fx_.kick();
  }
}

Result<json> MaintenanceCalls::maintenance_schedule(const json& p, const CallContext&) {
  // A front end gives the region's id (the same on every shard and broker).
  uint64_t region_id = 0;
  json params = p;
  if (params.is_object() && params.contains("id")) {
    if (!params["id"].is_number_unsigned())
      return field_error("id", "must be a region's event id (a number)");
    region_id = params["id"].get<uint64_t>();
    params.erase("id");
  }
  TRY_ASSIGN(MaintenanceEvent e, parse_maintenance_request(params, now_realtime_us()));
  // The target must name what this control plane knows.
  std::vector<Command> none;
  std::set<MachineId> untouched;
  if (maintenance_world(&none, &untouched).machines_of(e).empty())
    return field_error(e.target_kind,
                       "no machine is known by " + e.target_kind + " '" + e.target + "'")
        .with_code(rpc::kNotFound);
  TRY_ASSIGN(uint64_t id, maintenance_.schedule(e, region_id));
  group_->unsaved().maintenance.insert(id);
  if (auto s = fx_.persist({}, {}); !s.ok()) {
    maintenance_.forget(id);
    group_->unsaved().maintenance.insert(id);  // the next write deletes what may have been written
    return s.error();
  }
  // A notice already due drains now, not at the next round.
  clocks_.maintenance_soon();
  return to_json(maintenance_.events().at(id));
}

Result<json> MaintenanceCalls::maintenance_ls(const json& p, const CallContext&) {
  if (!p.is_object() && !p.is_null()) return field_error("params", "must be an object");
  bool all = false;
  if (p.is_object() && p.contains("all")) {
    if (!p["all"].is_boolean()) return field_error("all", "must be true or false");
    all = p["all"].get<bool>();
  }
  json arr = json::array();
  for (const auto& [id, e] : maintenance_.events())
    if (all || e.active()) arr.push_back(to_json(e));
  return json{{"events", arr}};
}

Result<json> MaintenanceCalls::maintenance_cancel(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("id") || !p["id"].is_number_unsigned())
    return field_error("id", "the event's id (a number) is required");
  uint64_t id = p["id"].get<uint64_t>();
  std::vector<Command> cmds;
  std::set<MachineId> touched;
  auto w = maintenance_world(&cmds, &touched);
  if (!maintenance_.cancel(id, w))
    return field_error("id", "no scheduled or running maintenance event " + std::to_string(id))
        .with_code(rpc::kNotFound);
  group_->unsaved().maintenance.insert(id);
  TRY(fx_.apply({std::move(cmds), {}, touched, true}));
  return to_json(maintenance_.events().at(id));
}

void MaintenanceCalls::register_calls(Calls& calls) {
  calls.add("maintenance.schedule", kAdminCall, this, &MaintenanceCalls::maintenance_schedule);
  calls.add("maintenance.ls", kViewerCall, this, &MaintenanceCalls::maintenance_ls);
  calls.add("maintenance.cancel", kAdminCall, this, &MaintenanceCalls::maintenance_cancel);
}

}  // namespace weft::cp
