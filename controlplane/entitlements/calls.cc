// Capacity that changes (docs/entitlements.md): an entitlement's quota and profile
// changed in place, an empty entitlement removed, a named machine given to an entitlement
// and taken back. Admin calls, audited like every admin call.
//
// A new profile rolls over the entitlement's machines: each keeps the old profile as its
// desired one until its turn; at most max_unavailable of them are applying the new
// profile at a time (they take no new tasks meanwhile; their tasks keep running while
// weft-sidekick applies the difference). Machines that join the entitlement during the
// roll get the new profile at once.
#include "common/cp_link.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "controlplane/daemon/manager.h"

namespace weft::cp {

using nlohmann::json;
using rpc::CallContext;

Status Manager::check_quota(EntitlementId e, size_t quota) const {
  // Machines that must stay: those running tasks and those an operator assigned.
  size_t kept = 0;
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == e && (alloc_.tasks_on(m) > 0 || alloc_.pinned(m))) ++kept;
  if (quota < kept)
    return field_error("quota", std::to_string(kept) +
                                    " of the entitlement's machines run tasks or were " +
                                    "assigned to it: scale its jobs down or release machines first")
        .with_code(rpc::kConflict);
  return {};
}

Status Manager::check_profile(const std::string& profile) const {
  if (!weft::valid_profile_name(profile))
    return field_error("profile", "'" + profile.substr(0, 100) +
                                      "' is not a profile name (1-64 letters, digits, '-', "
                                      "'_' and '.', not starting with '.')");
  // Known from the machines' sidekicks: a profile none of them has would leave every
  // machine lent to it preparing until the prepare timeout.
  std::set<std::string> known = reports_.known_profiles();
  if (!known.empty() && !known.count(profile)) {
    std::string list;
    for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
    return field_error("profile", "no machine's weft-sidekick has profile '" + profile +
                                      "' (they have: " + list.substr(0, 500) + ")");
  }
  return {};
}

void Manager::advance_profile_rolls() {
  std::set<MachineId> released = profile_rolls_.advance();
  if (released.empty()) return;
  // The sidekicks hear of it now; the machines take no new tasks until applied.
  pool_changes_.changed(released.begin(), released.end());
  push_profiles();
  kick();
}

json Manager::profile_roll_json(EntitlementId e) const {
  return profile_rolls_.status(e, [this](MachineId m) { return machine_name(m); });
}

// Only an empty entitlement: no job, no machine running its tasks, none assigned to it.
Result<json> Manager::api_entitlement_rm(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  const std::string name = p["name"].get<std::string>();
  auto id = broker_.entitlement(name);
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  std::string jobs;
  for (const auto& j : sched_.persisted_jobs())
    if (j.spec.entitlement_id == *id) jobs += (jobs.empty() ? "" : ", ") + j.spec.name;
  if (!jobs.empty())
    return field_error("name", "entitlement " + name + " still has jobs (" + jobs.substr(0, 300) +
                                   "): stop them first")
        .with_code(rpc::kConflict);
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == *id && alloc_.pinned(m))
      return field_error("name", "machine " + machine_name(m) + " is assigned to " + name +
                                     ": weftctl machine release it first")
          .with_code(rpc::kConflict);
  std::vector<MachineId> freed = alloc_.shrink(*id);
  if (alloc_.pool_size(*id) > 0)
    return field_error("name", "entitlement " + name + " still holds machines with tasks")
        .with_code(rpc::kConflict);
  const EntitlementSpec before = broker_.entitlement_spec(*id);
  broker_.forget_entitlement(*id);
  Status s = group_->open();
  if (s.ok()) s = store_->delete_entitlement(*id);
  if (s.ok()) s = persist({}, {freed.begin(), freed.end()});
  if (!s.ok()) {
    broker_.restore_entitlement(*id, before);  // not durable: not removed
    return std::move(s).error();
  }
  profile_rolls_.forget(*id);
  return json{{"name", name}, {"removed", true}, {"machines_freed", freed.size()}};
}

// An admin gives an entitlement a named machine: it must be free (or idle in no
// entitlement's use) and the entitlement below its quota. It stays until released.
Result<json> Manager::api_machine_assign(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  if (!p.contains("entitlement") || !p["entitlement"].is_string())
    return field_error("entitlement", "is required");
  auto e = broker_.entitlement(p["entitlement"].get<std::string>());
  if (!e) return field_error("entitlement", "no such entitlement").with_code(rpc::kNotFound);
  if (broker_.removed(m)) return field_error("machine", "machine was removed");
  EntitlementId before = alloc_.entitlement_of(m);
  if (before == *e) {
    alloc_.pin(m, true);
  } else {
    if (before != kFreePool) {
      const std::string& other = broker_.entitlements().count(before)
                                     ? broker_.entitlement_spec(before).name
                                     : std::to_string(before);
      if (alloc_.tasks_on(m) > 0 || alloc_.pinned(m))
        return field_error("machine", "machine " + machine_name(m) + " belongs to entitlement " +
                                          other +
                                          (alloc_.pinned(m) ? " (assigned)" : " and runs tasks"))
            .with_code(rpc::kConflict);
    }
    if (alloc_.quota_members(*e) >= broker_.entitlement_spec(*e).quota)
      return field_error("entitlement", "entitlement " + broker_.entitlement_spec(*e).name +
                                            " is at its quota of " +
                                            std::to_string(broker_.entitlement_spec(*e).quota) +
                                            " machines")
          .with_code(rpc::kConflict);
    TRY(alloc_.assign(m, *e));
    alloc_.pin(m, true);
  }
  if (auto s = persist({}, {m}); !s.ok()) {
    alloc_.pin(m, false);
    if (before != *e) (void)alloc_.assign(m, before);  // not durable: not moved
    return std::move(s).error();
  }
  push_profiles();
  kick();
  return json{{"machine", machine_name(m)},
              {"entitlement", broker_.entitlement_spec(*e).name},
              {"profile", broker_.desired_profile(m)}};
}

// Takes an assigned machine back: idle, it returns to the free pool now; running tasks,
// when they are gone (like any machine an entitlement no longer needs).
Result<json> Manager::api_machine_release(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  EntitlementId e = alloc_.entitlement_of(m);
  if (e == kFreePool) return field_error("machine", "machine is in the free pool already");
  bool was_pinned = alloc_.pinned(m);
  alloc_.pin(m, false);
  bool now = alloc_.tasks_on(m) == 0;
  if (now) TRY(alloc_.assign(m, kFreePool));
  if (auto s = persist({}, {m}); !s.ok()) {
    if (now) (void)alloc_.assign(m, e);  // not durable: not moved
    alloc_.pin(m, was_pinned);
    return std::move(s).error();
  }
  push_profiles();
  kick();
  return json{{"machine", machine_name(m)}, {"free", now}, {"tasks", alloc_.tasks_on(m)}};
}

}  // namespace weft::cp
