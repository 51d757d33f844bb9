// The shard's and the broker's side of a region (docs/regions.md): the calls a front
// end carries for operators (frontend.forward), the machines a broker lends (pool.lend,
// pool.return), a shard's steps of an entitlement's move (region.move), and the region's
// parts these need (lending, services across shards, checks against etcd, moves), made
// when this control plane leads. Each call checks its caller itself (Gate).
#pragma once

#include "controlplane/daemon/shard_parts.h"
#include "controlplane/machines/calls.h"

namespace weft::cp {

class RegionCalls : public Feature {
 public:
  explicit RegionCalls(const ShardParts& s, MachineCalls& machines,
                       std::function<std::map<std::string, std::set<std::string>>()> wanted);
  // Its calls, added plain: each checks its caller itself (a front end, a shard).
  void register_calls(Calls& calls) override;
  Status load_moves();
  Status start_region();

 private:
  Result<json> frontend_forward(const json& p, const CallContext& c);
  Result<json> pool_lend(const json& p, const CallContext& c);
  Result<json> pool_return(const json& p, const CallContext& c);
  Result<json> region_move(const json& p, const CallContext& c);

  const CpConfig& cfg_;
  EventLoop& loop_;
  Model& model_;
  ProfileRolls& profile_rolls_;
  const std::unique_ptr<StateStore>& store_;
  const std::unique_ptr<GroupCommit>& group_;
  const std::unique_ptr<Discovery>& discovery_;
  RegionParts& region_;
  const rpc::Dispatcher& methods_;
  Effects& fx_;
  const Gate& gate_;
  MachineCalls& machines_;
  std::function<std::map<std::string, std::set<std::string>>()> wanted_;
};

}  // namespace weft::cp
