#include "controlplane/entitlements/profile_rolls.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "common/log.h"

namespace weft::cp {

using nlohmann::json;

namespace {
constexpr size_t kMaxRollMachines = 100'000;  // as a region's move document allows
}  // namespace

void ProfileRolls::start(EntitlementId e, const std::string& from, size_t pace) {
  Roll& r = rolls_[e];
  r.pace = pace;
  r.from = from;
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == e && !broker_.profile_held(m)) {
      broker_.hold_profile(m, from);
      r.waiting.push_back(m);
    }
  save(e);
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
      save(e);
      continue;
    }
    const size_t waiting = r.waiting.size(), applying = r.applying.size();
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
      save(e);
      continue;
    }
    // (A machine released is one less waiting: every change shows in the two counts.)
    if (r.waiting.size() != waiting || r.applying.size() != applying) save(e);
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
  save(e);
}

void ProfileRolls::save(EntitlementId e) {
  const std::string key = kNotePrefix + std::to_string(e);
  auto m = moved(e, [this](MachineId id) { return broker_.persisted(id).info.id; });
  if (m)
    notes_.put(key, m->to_json());
  else
    notes_.erase(key);
}

void ProfileRolls::restore(const std::map<std::string, json>& notes) {
  const std::string prefix = kNotePrefix;
  for (const auto& [key, value] : notes) {
    const std::string id = key.substr(std::min(key.size(), prefix.size()));
    char* end = nullptr;
    unsigned long n = std::strtoul(id.c_str(), &end, 10);
    auto roll = Moved::from_json(value, "profile_roll");
    const bool known = !id.empty() && end && *end == '\0' && n > 0 && n <= UINT32_MAX &&
                       broker_.entitlements().count(static_cast<EntitlementId>(n));
    if (!known || !roll.ok()) {
      log_warn("a profile roll's note is not for an entitlement here: dropped",
               {{"KEY", key}, {"WHY", roll.ok() ? "no such entitlement" : roll.error().str()}});
      notes_.erase(key);
      continue;
    }
    const auto e = static_cast<EntitlementId>(n);
    adopt(e, *roll, [this](const std::string& name) { return broker_.find(name); });
    log_info("profile roll resumed", {{"ENTITLEMENT", broker_.entitlements().spec(e).name},
                                      {"WAITING", std::to_string(rolls_[e].waiting.size())},
                                      {"APPLYING", std::to_string(rolls_[e].applying.size())}});
  }
}

json ProfileRolls::Moved::to_json() const {
  return {{"from", from}, {"pace", pace}, {"waiting", waiting}, {"applying", applying}};
}

Result<ProfileRolls::Moved> ProfileRolls::Moved::from_json(const json& j, const std::string& path) {
  if (!j.is_object()) return field_error(path, "must be an object");
  Moved m;
  auto from = j.find("from");
  if (from == j.end() || !from->is_string())
    return field_error(path + ".from", "must be a profile's name");
  m.from = from->get<std::string>();
  auto pace = j.find("pace");
  if (pace == j.end() || !pace->is_number_unsigned() || pace->get<uint64_t>() < 1 ||
      pace->get<uint64_t>() > kMaxRollMachines)
    return field_error(path + ".pace",
                       "must be a whole number from 1 to " + std::to_string(kMaxRollMachines));
  m.pace = pace->get<uint64_t>();
  for (auto [name, out] : {std::pair{"waiting", &m.waiting}, std::pair{"applying", &m.applying}}) {
    auto list = j.find(name);
    if (list == j.end() || !list->is_array() || list->size() > kMaxRollMachines)
      return field_error(path + "." + name, "must be a list of machines");
    for (size_t i = 0; i < list->size(); ++i) {
      if (!(*list)[i].is_string())
        return field_error(path + "." + name + "[" + std::to_string(i) + "]",
                           "must be a machine's name");
      out->push_back((*list)[i].get<std::string>());
    }
  }
  return m;
}

void ProfileRolls::forget(EntitlementId e) {
  auto roll = rolls_.find(e);
  if (roll == rolls_.end()) return;
  for (MachineId m : roll->second.waiting) broker_.release_profile(m);
  rolls_.erase(roll);
  save(e);
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
