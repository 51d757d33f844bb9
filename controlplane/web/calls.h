// The read-only web view's page (web_view.h, docs/web-view.md): served on its own
// listener and as web.page.
#pragma once

#include "controlplane/daemon/shard_parts.h"
#include "controlplane/entitlements/calls.h"

namespace weft::cp {

class WebCalls : public Feature {
 public:
  explicit WebCalls(const ShardParts& s, const EntitlementCalls& entitlements);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;
  std::string web_page() const;

 private:
  Result<json> web_page(const json&, const rpc::CallContext&);

  const CpConfig& cfg_;
  Model& model_;
  JobEvents& job_events_;
  Maintenance& maintenance_;
  ProfileRolls& profile_rolls_;
  const ReplicaRole& replica_;
  const std::unique_ptr<UsageGlance>& usage_glance_;
  const EntitlementCalls& entitlements_;
};

}  // namespace weft::cp
