// Capacity that changes (docs/entitlements.md): an entitlement's quota and profile
// changed in place, an empty entitlement removed, a named machine given to an entitlement
// and taken back. Admin calls, audited like every admin call.
//
// A new profile rolls over the entitlement's machines: each keeps the old profile as its
// desired one until its turn; at most max_unavailable of them are applying the new
// profile at a time (they take no new tasks meanwhile; their tasks keep running while
// weft-sidekick applies the difference). Machines that join the entitlement during the
// roll get the new profile at once.
#include "controlplane/entitlements/calls.h"
#include "common/cp_link.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "controlplane/region/region.h"

namespace weft::cp {

using nlohmann::json;
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

// An entitlement's own fields, as entitlement.ls and entitlement.show give them.
json entitlement_json(EntitlementId id, const EntitlementSpec& e) {
  return {{"id", id},   {"name", e.name},     {"quota", e.quota},           {"profile", e.profile},
          {"dc", e.dc}, {"owners", e.owners}, {"grants", to_json(e.grants)}};
}

}  // namespace

EntitlementCalls::EntitlementCalls(const ShardParts& s)
    : cfg_(s.cfg),
      model_(s.model),
      profile_rolls_(s.profile_rolls),
      store_(s.store),
      group_(s.group),
      region_(s.region),
      fx_(s.fx) {}

Result<json> EntitlementCalls::entitlement_create(const json& p, const CallContext& c) {
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

Result<json> EntitlementCalls::create_entitlement(const EntitlementSpec& e) {
  TRY_ASSIGN(EntitlementId id, model_.broker.entitlements().create(e));
  if (auto s = fx_.persist({}, {}); !s.ok()) {
    model_.broker.entitlements().forget(id);  // not durable: not created
    return std::move(s).error();
  }
  return json{{"id", id}, {"name", e.name}};
}

Result<json> EntitlementCalls::entitlement_update(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  auto id = model_.broker.entitlements().named(p["name"].get<std::string>());
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
  const EntitlementSpec before = model_.broker.entitlements().spec(*id);
  if (owners) model_.broker.entitlements().set_owners(*id, *owners);
  if (grants) model_.broker.entitlements().set_grants(*id, *grants);
  if (quota) model_.broker.entitlements().set_quota(*id, *quota);
  bool roll = profile && *profile != before.profile;
  if (roll) model_.broker.entitlements().set_profile(*id, *profile);
  if (auto s = fx_.persist({}, {}); !s.ok()) {
    model_.broker.entitlements().set_owners(*id, before.owners);  // not durable: not changed
    model_.broker.entitlements().set_grants(*id, before.grants);
    model_.broker.entitlements().set_quota(*id, before.quota);
    model_.broker.entitlements().set_profile(*id, before.profile);
    return std::move(s).error();
  }
  if (quota && *quota < before.quota) {
    // Idle machines beyond the new quota go back to the free pool now.
    std::vector<MachineId> freed = model_.alloc.shrink(*id);
    if (!freed.empty()) TRY(fx_.persist({}, {freed.begin(), freed.end()}));
  }
  if (roll) {
    profile_rolls_.start(*id, before.profile, static_cast<size_t>(pace));
    advance_profile_rolls();
  }
  const EntitlementSpec& now = model_.broker.entitlements().spec(*id);
  json j = entitlement_json(*id, now);
  j["machines"] = model_.alloc.pool(*id).machines;
  if (roll) j["profile_roll"] = profile_roll_json(*id);
  return j;
}

Result<json> EntitlementCalls::entitlement_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& [id, e] : model_.broker.entitlements()) {
    json j = entitlement_json(id, e);
    j["machines"] = model_.alloc.pool(id).machines;
    arr.push_back(std::move(j));
  }
  return json{{"entitlements", arr}};
}

Result<json> EntitlementCalls::entitlement_show(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  auto id = model_.broker.entitlements().named(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  const auto& e = model_.broker.entitlements().spec(*id);
  json machines = json::array(), jobs = json::array();
  for (MachineId m = 0; m < model_.alloc.machine_count(); ++m)
    if (model_.alloc.entitlement_of(m) == *id)
      machines.push_back(
          machine_json(m, model_.alloc, model_.broker, model_.reports, model_.sessions));
  for (const auto& j : model_.sched.handover().persisted_jobs())
    if (j.spec.entitlement_id == *id) jobs.push_back(j.spec.name);
  json j = entitlement_json(*id, e);
  j["machines"] = std::move(machines);
  j["jobs"] = std::move(jobs);
  if (profile_rolls_.rolling(*id)) j["profile_roll"] = profile_roll_json(*id);
  if (region_.moves)
    if (json m = region_.moves->status(*id); !m.is_null()) j["moving"] = std::move(m);
  return j;
}

// Only an empty entitlement: no job, no machine running its tasks, none assigned to it.
Result<json> EntitlementCalls::entitlement_rm(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  const std::string name = p["name"].get<std::string>();
  auto id = model_.broker.entitlements().named(name);
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  std::string jobs;
  for (const auto& j : model_.sched.handover().persisted_jobs())
    if (j.spec.entitlement_id == *id) jobs += (jobs.empty() ? "" : ", ") + j.spec.name;
  if (!jobs.empty())
    return field_error("name", "entitlement " + name + " still has jobs (" + jobs.substr(0, 300) +
                                   "): stop them first")
        .with_code(rpc::kConflict);
  for (MachineId m = 0; m < model_.alloc.machine_count(); ++m)
    if (model_.alloc.entitlement_of(m) == *id && model_.alloc.pinned(m))
      return field_error("name", "machine " + fx_.machine_name(m) + " is assigned to " + name +
                                     ": weftctl machine release it first")
          .with_code(rpc::kConflict);
  std::vector<MachineId> freed = model_.alloc.shrink(*id);
  if (model_.alloc.pool(*id).machines > 0)
    return field_error("name", "entitlement " + name + " still holds machines with tasks")
        .with_code(rpc::kConflict);
  const EntitlementSpec before = model_.broker.entitlements().spec(*id);
  model_.broker.entitlements().forget(*id);
  Status s = group_->open();
  if (s.ok()) s = store_->delete_entitlement(*id);
  if (s.ok()) s = fx_.persist({}, {freed.begin(), freed.end()});
  if (!s.ok()) {
    model_.broker.entitlements().restore(*id, before);  // not durable: not removed
    return std::move(s).error();
  }
  profile_rolls_.forget(*id);
  return json{{"name", name}, {"removed", true}, {"machines_freed", freed.size()}};
}

// An admin gives an entitlement a named machine: it must be free (or idle in no
// entitlement's use) and the entitlement below its quota. It stays until released.
Result<json> EntitlementCalls::machine_assign(const json& p, const CallContext&) {
  TRY_ASSIGN(MachineId m, machine_of(model_.broker, p));
  if (!p.contains("entitlement") || !p["entitlement"].is_string())
    return field_error("entitlement", "is required");
  auto e = model_.broker.entitlements().named(p["entitlement"].get<std::string>());
  if (!e) return field_error("entitlement", "no such entitlement").with_code(rpc::kNotFound);
  if (model_.broker.removed(m)) return field_error("machine", "machine was removed");
  EntitlementId before = model_.alloc.entitlement_of(m);
  if (before == *e) {
    model_.alloc.pin(m, true);
  } else {
    if (before != kFreePool) {
      const std::string& other = model_.broker.entitlements().count(before)
                                     ? model_.broker.entitlements().spec(before).name
                                     : std::to_string(before);
      if (model_.alloc.tasks_on(m) > 0 || model_.alloc.pinned(m))
        return field_error("machine",
                           "machine " + fx_.machine_name(m) + " belongs to entitlement " + other +
                               (model_.alloc.pinned(m) ? " (assigned)" : " and runs tasks"))
            .with_code(rpc::kConflict);
    }
    if (model_.alloc.pool(*e).quota_members >= model_.broker.entitlements().spec(*e).quota)
      return field_error("entitlement",
                         "entitlement " + model_.broker.entitlements().spec(*e).name +
                             " is at its quota of " +
                             std::to_string(model_.broker.entitlements().spec(*e).quota) +
                             " machines")
          .with_code(rpc::kConflict);
    TRY(model_.alloc.assign(m, *e));
    model_.alloc.pin(m, true);
  }
  if (auto s = fx_.persist({}, {m}); !s.ok()) {
    model_.alloc.pin(m, false);
    if (before != *e) (void)model_.alloc.assign(m, before);  // not durable: not moved
    return std::move(s).error();
  }
  fx_.push_profiles();
  fx_.kick();
  return json{{"machine", fx_.machine_name(m)},
              {"entitlement", model_.broker.entitlements().spec(*e).name},
              {"profile", model_.broker.desired_profile(m)}};
}

// Takes an assigned machine back: idle, it returns to the free pool now; running tasks,
// when they are gone (like any machine an entitlement no longer needs).
Result<json> EntitlementCalls::machine_release(const json& p, const CallContext&) {
  TRY_ASSIGN(MachineId m, machine_of(model_.broker, p));
  EntitlementId e = model_.alloc.entitlement_of(m);
  if (e == kFreePool) return field_error("machine", "machine is in the free pool already");
  bool was_pinned = model_.alloc.pinned(m);
  model_.alloc.pin(m, false);
  bool now = model_.alloc.tasks_on(m) == 0;
  if (now) TRY(model_.alloc.assign(m, kFreePool));
  if (auto s = fx_.persist({}, {m}); !s.ok()) {
    if (now) (void)model_.alloc.assign(m, e);  // not durable: not moved
    model_.alloc.pin(m, was_pinned);
    return std::move(s).error();
  }
  fx_.push_profiles();
  fx_.kick();
  return json{{"machine", fx_.machine_name(m)}, {"free", now}, {"tasks", model_.alloc.tasks_on(m)}};
}

Status EntitlementCalls::check_quota(EntitlementId e, size_t quota) const {
  // Machines that must stay: those running tasks and those an operator assigned.
  size_t kept = 0;
  for (MachineId m = 0; m < model_.alloc.machine_count(); ++m)
    if (model_.alloc.entitlement_of(m) == e &&
        (model_.alloc.tasks_on(m) > 0 || model_.alloc.pinned(m)))
      ++kept;
  if (quota < kept)
    return field_error("quota", std::to_string(kept) +
                                    " of the entitlement's machines run tasks or were " +
                                    "assigned to it: scale its jobs down or release machines first")
        .with_code(rpc::kConflict);
  return {};
}

Status EntitlementCalls::check_profile(const std::string& profile) const {
  if (!weft::valid_profile_name(profile))
    return field_error("profile", "'" + profile.substr(0, 100) +
                                      "' is not a profile name (1-64 letters, digits, '-', "
                                      "'_' and '.', not starting with '.')");
  // Known from the machines' sidekicks: a profile none of them has would leave every
  // machine lent to it preparing until the prepare timeout.
  std::set<std::string> known = model_.reports.known_profiles();
  if (!known.empty() && !known.count(profile)) {
    std::string list;
    for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
    return field_error("profile", "no machine's weft-sidekick has profile '" + profile +
                                      "' (they have: " + list.substr(0, 500) + ")");
  }
  return {};
}

void EntitlementCalls::advance_profile_rolls() {
  std::set<MachineId> released = profile_rolls_.advance();
  if (released.empty()) return;
  // The sidekicks hear of it now; the machines take no new tasks until applied.
  model_.pool_changes.changed(released.begin(), released.end());
  fx_.push_profiles();
  fx_.kick();
}

json EntitlementCalls::profile_roll_json(EntitlementId e) const {
  return profile_rolls_.status(e, [this](MachineId m) { return fx_.machine_name(m); });
}

void EntitlementCalls::register_calls(Calls& calls) {
  calls.add("entitlement.create", kAdminCall, this, &EntitlementCalls::entitlement_create);
  calls.add("entitlement.update", kAdminCall, this, &EntitlementCalls::entitlement_update);
  calls.add("entitlement.rm", kAdminCall, this, &EntitlementCalls::entitlement_rm);
  calls.add("entitlement.ls", kViewerCall, this, &EntitlementCalls::entitlement_ls);
  calls.add("entitlement.show", kViewerCall, this, &EntitlementCalls::entitlement_show);
  calls.add("machine.assign", kAdminCall, this, &EntitlementCalls::machine_assign);
  calls.add("machine.release", kAdminCall, this, &EntitlementCalls::machine_release);
}

}  // namespace weft::cp
