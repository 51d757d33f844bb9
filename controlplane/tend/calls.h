// Tending the jobs (docs/jobs.md "Autoscaling", docs/rebalancer.md): autoscaling's
// rounds and the ReBalancer's, started when this control plane leads, and their calls
// (job.autoscale and its pause, rebalance.plan, status and pause). What they decide
// goes through Effects::apply like every other decision.
#pragma once

#include "controlplane/daemon/shard_parts.h"
#include "controlplane/tend/autoscale_rounds.h"
#include "controlplane/tend/rebalancer.h"

namespace weft::cp {

class TendCalls : public Feature {
 public:
  explicit TendCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;
  void start_autoscaling();
  void start_rebalancer();
  // The ReBalancer's wish for machines by fault domain (lending), none when it is off.
  std::map<std::string, std::set<std::string>> wanted() const {
    return rebalancer_ ? rebalancer_->wanted() : std::map<std::string, std::set<std::string>>();
  }

 private:
  Result<json> job_autoscale(const json& p, const CallContext&);
  Result<json> job_autoscale_pause(const json& p, const CallContext& c);
  Result<json> rebalance_plan(const json& p, const CallContext&);
  Result<json> rebalance_status(const json& p, const CallContext&);
  Result<json> rebalance_pause(const json& p, const CallContext& c);

  const CpConfig& cfg_;
  EventLoop& loop_;
  Model& model_;
  const std::unique_ptr<AgentAsks>& agent_asks_;
  const std::unique_ptr<AuditLog>& audit_;
  Effects& fx_;
  const Gate& gate_;
  std::unique_ptr<AutoscaleRounds> autoscaling_;  // once leading
  std::unique_ptr<Rebalancer> rebalancer_;        // once leading, when enabled
};

}  // namespace weft::cp
