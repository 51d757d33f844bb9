// The entitlements' calls (docs/entitlements.md): entitlements made, changed in place
// (owners, grants, quota, and a new host profile rolled over their machines: profile_rolls.h),
// listed and removed, and named machines given to an entitlement and taken back.
// Admin calls, audited like every admin call; ls and show for viewers.
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class EntitlementCalls : public Feature {
 public:
  explicit EntitlementCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;
  void advance_profile_rolls();
  json profile_roll_json(EntitlementId e) const;

 private:
  Result<json> entitlement_create(const json& p, const CallContext& c);
  Result<json> create_entitlement(const EntitlementSpec& e);
  Result<json> entitlement_update(const json& p, const CallContext&);
  Result<json> entitlement_ls(const json&, const CallContext&);
  Result<json> entitlement_show(const json& p, const CallContext&);
  Result<json> entitlement_rm(const json& p, const CallContext&);
  Result<json> machine_assign(const json& p, const CallContext& c);
  Result<json> machine_release(const json& p, const CallContext& c);
  Status check_quota(EntitlementId e, size_t quota) const;
  Status check_profile(const std::string& profile) const;

  const CpConfig& cfg_;
  Model& model_;
  ProfileRolls& profile_rolls_;
  const std::unique_ptr<StateStore>& store_;
  const std::unique_ptr<GroupCommit>& group_;
  const RegionParts& region_;
  Effects& fx_;
};

}  // namespace weft::cp
