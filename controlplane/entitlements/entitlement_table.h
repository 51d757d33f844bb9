// The region's (or the shard's) entitlements (docs/entitlements.md): each one's spec by
// its id, the quota told to the allocator. An id is never given again in a process's
// life, so that what was recorded under a removed entitlement (its ended tasks' output)
// never passes to a new one. Every setter returns the value it replaced, so that a
// caller whose write failed can put it back.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/task_grants.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

struct EntitlementSpec {
  std::string name;
  size_t quota = 0;     // machines
  std::string profile;  // host profile its machines run ("" = the default)
  std::string dc;       // "" = any
  // Who may change its jobs besides admins: principal patterns (controlplane/api/access.h).
  std::vector<std::string> owners;
  // What its jobs' tasks may ask of the host beyond the restricted default
  // (common/task_grants.h, docs/security.md); set by admins.
  TaskGrants grants;
  // `weftctl rebalance pause`: the ReBalancer makes no moves in it (docs/rebalancer.md).
  bool rebalance_paused = false;
};

class EntitlementTable {
 public:
  using Specs = std::map<EntitlementId, EntitlementSpec>;
  explicit EntitlementTable(Allocator& alloc) : alloc_(alloc) {}

  Result<EntitlementId> create(const EntitlementSpec& spec);
  // Undoes a create whose write failed (nothing can use it yet).
  void forget(EntitlementId id);
  // After a restart: the entitlement as it was stored, with its id.
  void restore(EntitlementId id, const EntitlementSpec& spec);
  // Its owners and grants; entitlement.update --quota / --profile (the caller checked
  // them); rebalance pause.
  std::vector<std::string> set_owners(EntitlementId id, std::vector<std::string> owners) {
    return std::exchange(specs_.at(id).owners, std::move(owners));
  }
  TaskGrants set_grants(EntitlementId id, TaskGrants grants) {
    return std::exchange(specs_.at(id).grants, std::move(grants));
  }
  size_t set_quota(EntitlementId id, size_t quota);
  std::string set_profile(EntitlementId id, std::string profile) {
    return std::exchange(specs_.at(id).profile, std::move(profile));
  }
  bool set_rebalance_paused(EntitlementId id, bool paused) {
    return std::exchange(specs_.at(id).rebalance_paused, paused);
  }

  std::optional<EntitlementId> named(const std::string& name) const;
  const EntitlementSpec& spec(EntitlementId id) const { return specs_.at(id); }
  // Read as the map it is, in id order.
  Specs::const_iterator begin() const { return specs_.begin(); }
  Specs::const_iterator end() const { return specs_.end(); }
  Specs::const_iterator find(EntitlementId id) const { return specs_.find(id); }
  size_t count(EntitlementId id) const { return specs_.count(id); }
  size_t size() const { return specs_.size(); }
  bool empty() const { return specs_.empty(); }

 private:
  Allocator& alloc_;
  Specs specs_;
  EntitlementId next_id_ = 1;
};

}  // namespace weft::cp
