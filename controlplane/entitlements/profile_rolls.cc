#include "controlplane/entitlements/profile_rolls.h"

#include <algorithm>

#include "common/log.h"

namespace weft::cp {

using nlohmann::json;

void ProfileRolls::start(EntitlementId e, const std::string& from, size_t pace) {
  Roll& r = rolls_[e];
  r.pace = pace;
  r.from = from;
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == e && !broker_.profile_held(m)) {
      broker_.hold_profile(m, from);
      r.waiting.push_back(m);
    }
  log_info("profile roll started", {{"ENTITLEMENT", broker_.entitlements().spec(e).name},
                                    {"TO", broker_.entitlements().spec(e).profile},
                                    {"MACHINES", std::to_string(r.waiting.size())}});
}

std::set<MachineId> ProfileRolls::advance() {
  std::set<MachineId> released;
  for (auto it = rolls_.begin(); it != rolls_.end();) {
    EntitlementId e = it->first;
    Roll& r = it->second;
    if (fenced_.count(e)) {  // moving between shards: it goes on where it arrives
      ++it;
      continue;
    }
    if (!broker_.entitlements().count(e)) {
      for (MachineId m : r.waiting) broker_.release_profile(m);
      it = rolls_.erase(it);
      continue;
    }
    // Machines that left the entitlement are no longer held.
    std::erase_if(r.waiting, [&](MachineId m) {
      if (alloc_.entitlement_of(m) == e) return false;
      broker_.release_profile(m);
      return true;
    });
    // Applying: released, not yet on the new profile (and still alive: a dead machine is
    // not waited for).
    std::erase_if(r.applying, [&](MachineId m) {
      return alloc_.entitlement_of(m) != e || broker_.profile_ready(m) || !broker_.healthy(m);
    });
    while (r.applying.size() < r.pace && !r.waiting.empty()) {
      MachineId m = r.waiting.front();
      r.waiting.erase(r.waiting.begin());
      broker_.release_profile(m);
      r.applying.insert(m);
      released.insert(m);
    }
    if (r.waiting.empty() && r.applying.empty()) {
      log_info("profile roll done", {{"ENTITLEMENT", broker_.entitlements().spec(e).name},
                                     {"PROFILE", broker_.entitlements().spec(e).profile}});
      it = rolls_.erase(it);
      continue;
    }
    ++it;
  }
  return released;
}

std::optional<ProfileRolls::Moved> ProfileRolls::moved(
    EntitlementId e, const std::function<std::string(MachineId)>& machine_name) const {
  auto it = rolls_.find(e);
  if (it == rolls_.end()) return std::nullopt;
  Moved m{it->second.from, it->second.pace, {}, {}};
  for (MachineId id : it->second.waiting) m.waiting.push_back(machine_name(id));
  for (MachineId id : it->second.applying) m.applying.push_back(machine_name(id));
  return m;
}

void ProfileRolls::adopt(EntitlementId e, const Moved& m,
                         const std::function<std::optional<MachineId>(const std::string&)>& id_of) {
  forget(e);
  Roll& r = rolls_[e];
  r.from = m.from;
  r.pace = std::max<size_t>(m.pace, 1);
  for (const auto& name : m.waiting)
    if (auto id = id_of(name); id && alloc_.entitlement_of(*id) == e) {
      broker_.hold_profile(*id, m.from);
      r.waiting.push_back(*id);
    }
  for (const auto& name : m.applying)
    if (auto id = id_of(name); id && alloc_.entitlement_of(*id) == e) r.applying.insert(*id);
}

void ProfileRolls::forget(EntitlementId e) {
  auto roll = rolls_.find(e);
  if (roll == rolls_.end()) return;
  for (MachineId m : roll->second.waiting) broker_.release_profile(m);
  rolls_.erase(roll);
}

json ProfileRolls::status(EntitlementId e,
                          const std::function<std::string(MachineId)>& machine_name) const {
  auto it = rolls_.find(e);
  if (it == rolls_.end()) return json{{"done", true}};
  json applying = json::array(), waiting = json::array();
  for (MachineId m : it->second.applying) applying.push_back(machine_name(m));
  for (MachineId m : it->second.waiting) waiting.push_back(machine_name(m));
  return json{{"done", false},
              {"from", it->second.from},
              {"max_unavailable", it->second.pace},
              {"applying", applying},
              {"waiting", waiting}};
}

}  // namespace weft::cp
