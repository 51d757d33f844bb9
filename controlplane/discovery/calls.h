// The service.* calls (docs/services.md): the work is Discovery's (discovery.h).
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class DiscoveryCalls : public Feature {
 public:
  explicit DiscoveryCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;

 private:
  Result<json> service_ls(const json& p, const CallContext&);
  Result<json> service_show(const json& p, const CallContext&);
  Result<json> service_interest(const json& p, const CallContext& c);
  Result<json> service_watch(const json& p, const CallContext& c);

  Model& model_;
  const std::unique_ptr<Discovery>& discovery_;
};

}  // namespace weft::cp
