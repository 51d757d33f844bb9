#include "controlplane/entitlements/entitlement_table.h"

#include <algorithm>

namespace weft::cp {

Result<EntitlementId> EntitlementTable::create(const EntitlementSpec& spec) {
  if (spec.name.empty()) return field_error("name", "an entitlement needs a name");
  if (spec.quota < 1) return field_error("quota", "must be at least 1 machine");
  if (named(spec.name)) return field_error("name", "entitlement " + spec.name + " exists");
  auto id = static_cast<EntitlementId>(specs_.empty() ? 1 : specs_.rbegin()->first + 1);
  id = std::max(id, next_id_);
  next_id_ = id + 1;
  specs_[id] = spec;
  alloc_.set_quota(id, spec.quota);
  return id;
}

void EntitlementTable::forget(EntitlementId id) {
  specs_.erase(id);
  alloc_.set_quota(id, 0);
}

void EntitlementTable::restore(EntitlementId id, const EntitlementSpec& spec) {
  specs_[id] = spec;
  alloc_.set_quota(id, spec.quota);
}

size_t EntitlementTable::set_quota(EntitlementId id, size_t quota) {
  size_t before = std::exchange(specs_.at(id).quota, quota);
  alloc_.set_quota(id, quota);
  return before;
}

std::optional<EntitlementId> EntitlementTable::named(const std::string& name) const {
  for (const auto& [id, e] : specs_)
    if (e.name == name) return id;
  return std::nullopt;
}

}  // namespace weft::cp
