// task.logs on the control plane (docs/logs.md): which task, who may read it, and the
// audit; the reading itself is the log relay's (log_relay.h).
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class LogCalls : public Feature {
 public:
  explicit LogCalls(const ShardParts& s);
  // task.logs: a viewer call that makes its own check (may_read_logs) and audit: logs can hold
  // secrets.
  void register_calls(Calls& calls) override;

 private:
  bool may_read_logs(const Caller& who, EntitlementId e) const;
  Result<json> task_logs(const json& p, const CallContext& c);

  const CpConfig& cfg_;
  Model& model_;
  const std::unique_ptr<LogRelay>& log_relay_;
  const std::unique_ptr<AuditLog>& audit_;
  const Gate& gate_;
};

}  // namespace weft::cp
