// The service.* methods (docs/services.md): the work is Discovery's (discovery.h).
#include "controlplane/discovery/calls.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

DiscoveryCalls::DiscoveryCalls(const ShardParts& s) : model_(s.model), discovery_(s.discovery) {}

Result<json> DiscoveryCalls::service_ls(const json& p, const CallContext&) {
  return discovery_->ls(p);
}

Result<json> DiscoveryCalls::service_show(const json& p, const CallContext&) {
  return discovery_->show(p);
}

// An agent's DNS clients asked for jobs it had not been told of (docs/services.md
// "Interest").
Result<json> DiscoveryCalls::service_interest(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(model_.broker, p, c));
  return discovery_->interest(m, c.session, p);
}

Result<json> DiscoveryCalls::service_watch(const json& p, const CallContext& c) {
  return discovery_->watch(p, c);
}

void DiscoveryCalls::register_calls(Calls& calls) {
  calls.add("service.ls", kViewerCall, this, &DiscoveryCalls::service_ls);
  calls.add("service.show", kViewerCall, this, &DiscoveryCalls::service_show);
  calls.add("service.watch", kViewerCall, this, &DiscoveryCalls::service_watch);
  calls.add("service.interest", kMachineCall, this, &DiscoveryCalls::service_interest);
}

}  // namespace weft::cp
