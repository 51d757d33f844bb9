#include "controlplane/machines/lookup.h"

#include "controlplane/api/gate.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

Result<MachineId> machine_of(const Broker& broker, const json& p) {
  if (!p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  auto m = broker.find(p["machine"].get<std::string>());
  if (!m) return field_error("machine", "unknown machine; call machine.register first");
  // Removed (machine rm, or gone to another control plane of the region): listed no
  // more, so not found by an operator's call either (a region's front end looks for the
  // one control plane that has it).
  if (broker.removed(*m))
    return field_error("machine", "machine " + p["machine"].get<std::string>() +
                                      " was removed (or went to another control plane)")
        .with_code(rpc::kNotFound);
  return *m;
}

Result<MachineId> own_machine(const Broker& broker, const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  return own_machine(broker, p["machine"].get_ref<const std::string&>(), c);
}

Result<MachineId> own_machine(const Broker& broker, const std::string& id, const CallContext& c) {
  if (id.empty()) return field_error("machine", "the machine id is required");
  // The certificate first: a machine certificate learns nothing of other machines, not
  // even whether an id exists.
  TRY(check_machine_identity(c.peer, id));
  auto m = broker.find(id);
  if (!m) return field_error("machine", "unknown machine; call machine.register first");
  return *m;
}

json machine_json(MachineId m, const Allocator& alloc, const Broker& broker,
                  const MachineReports& reports, const MachineSessions& sessions) {
  auto ent = broker.entitlements().find(alloc.entitlement_of(m));
  auto p = broker.persisted(m);
  return {{"machine", p.info.id},
          {"state", broker.state_of(m)},
          {"entitlement", ent == broker.entitlements().end() ? "" : ent->second.name},
          {"dc", p.info.dc},
          {"domain", p.info.domain},
          {"type", p.info.type},
          {"cpu_milli", p.info.capacity.cpu_milli},
          {"mem_mb", p.info.capacity.mem_mb},
          {"tasks", alloc.tasks_on(m)},
          {"drained", p.drained},
          {"profile", p.applied_profile},
          {"desired_profile", broker.desired_profile(m)},
          {"profile_state", MachineReports::get(reports.profile_state, m)},
          {"problems", MachineReports::get(reports.problems, m)},
          {"controllers", MachineReports::get(reports.controllers, m)},
          {"connected", sessions.agent(m) != nullptr},
          {"sidekick_connected", sessions.sidekick(m) != nullptr},
          {"unprepared", broker.unprepared_reason(m)}};
}

json task_json(const TaskRecord& t, const Allocator& a) {
  json j{{"id", t.id},
         {"job", t.job},
         {"index", t.index},
         {"generation", t.generation},
         {"machine", a.spec(t.machine).name},
         {"state", task_state_name(t.state)},
         {"ready", available(t)},
         {"message", t.message}};
  if (!t.ports.empty()) j["ports"] = t.ports;
  return j;
}

}  // namespace weft::cp
