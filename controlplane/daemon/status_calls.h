// The control plane's own calls: controlplane.status (answered by followers too: clients
// find the leader with it) and audit.ls (the audit log, docs/security.md).
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class StatusCalls : public Feature {
 public:
  explicit StatusCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;

 private:
  Result<json> controlplane_status(const json&, const CallContext&);
  Result<json> audit_ls(const json& p, const CallContext&);

  const CpConfig& cfg_;
  const ReplicaRole& replica_;
  const std::unique_ptr<StateStore>& store_;
};

}  // namespace weft::cp
