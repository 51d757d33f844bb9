// The service.* methods (docs/services.md): the work is Discovery's (discovery.h).
#include "controlplane/daemon/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

Result<json> Manager::api_service_ls(const json& p, const CallContext&) {
  return discovery_->ls(p);
}

Result<json> Manager::api_service_show(const json& p, const CallContext&) {
  return discovery_->show(p);
}

// An agent's DNS clients asked for jobs it had not been told of (docs/services.md
// "Interest").
Result<json> Manager::api_service_interest(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  return discovery_->interest(m, c.session, p);
}

Result<json> Manager::api_service_watch(const json& p, const CallContext& c) {
  return discovery_->watch(p, c);
}

}  // namespace weft::cp
