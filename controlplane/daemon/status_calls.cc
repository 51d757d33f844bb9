#include "controlplane/daemon/status_calls.h"

#include "common/json_bounded.h"
#include "controlplane/region/region.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

StatusCalls::StatusCalls(const ShardParts& s) : cfg_(s.cfg), replica_(s.replica), store_(s.store) {}

Result<json> StatusCalls::controlplane_status(const json&, const CallContext&) {
  // Answered by followers too (the one call they do not refuse): clients find the
  // leader with it.
  json j{{"store", store_ ? store_->kind() : "none"},
         {"leading", !replica_.following()},
         {"leader", replica_.following() ? replica_.leader_hint() : advertised(cfg_)},
         {"role", region_role_name(cfg_.region.role)}};
  if (replica_.replicated()) j["identity"] = advertised(cfg_);
  if (!cfg_.region.shard.empty()) j["shard"] = cfg_.region.shard;
  return j;
}

Result<json> StatusCalls::audit_ls(const json& p, const CallContext&) {
  TRY_ASSIGN(int64_t since, int_member(p, "since_wall_us", 0, 0, INT64_MAX));
  TRY_ASSIGN(int64_t limit, int_member(p, "limit", 1000, 1, 100'000));
  TRY_ASSIGN(auto rows, store_->audit(since, static_cast<size_t>(limit)));
  json arr = json::array();
  for (const auto& a : rows)
    arr.push_back({{"seq", a.seq},
                   {"at_wall_us", a.at_wall_us},
                   {"who", a.who},
                   {"role", a.role},
                   {"method", a.method},
                   {"target", a.target},
                   {"params_sha256", a.digest},
                   {"result", a.result}});
  return json{{"entries", arr}};
}

void StatusCalls::register_calls(Calls& calls) {
  calls.add("controlplane.status", kViewerCall, this, &StatusCalls::controlplane_status);
  calls.add("audit.ls", kViewerCall, this, &StatusCalls::audit_ls);
}

}  // namespace weft::cp
