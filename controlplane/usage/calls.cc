#include "controlplane/usage/calls.h"

#include "controlplane/usage/top.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

UsageCalls::UsageCalls(const ShardParts& s) : model_(s.model), agent_asks_(s.agent_asks) {}

Result<json> UsageCalls::top(const json& p, const CallContext& c) {
  TRY_ASSIGN(TopQuery q, parse_top_query(p));
  if (!agent_asks_) return make_error("not leading").with_code(rpc::kUnavailable);
  if (!c.session) return make_error("top is served on sessions only");
  auto reply = c.session->defer_reply();
  // At most 3 s: a machine that has not answered by then is named, not waited for.
  agent_asks_->usage(
      top_asks(q, model_.alloc, model_.sched), 3'000'000,
      [this, q, reply](AgentAsks::Answer a) { reply(top_json(q, a, model_.alloc, model_.sched)); });
  return json();
}

void UsageCalls::register_calls(Calls& calls) {
  calls.add("top", kViewerCall, this, &UsageCalls::top);
}

}  // namespace weft::cp
