// `top` (weftctl top, docs/operations.md): what running tasks use, asked of the agents
// (agent_asks.h) with a deadline, by task, job or machine (top.h).
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class UsageCalls : public Feature {
 public:
  explicit UsageCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;

 private:
  Result<json> top(const json& p, const CallContext& c);

  Model& model_;
  const std::unique_ptr<AgentAsks>& agent_asks_;
};

}  // namespace weft::cp
