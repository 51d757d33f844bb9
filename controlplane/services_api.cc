// The service.* methods (docs/services.md): the work is Discovery's (discovery.h).
#include "controlplane/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

Result<json> Manager::api_service_ls(const json& p, const CallContext&) {
  return discovery_->ls(p);
}

Result<json> Manager::api_service_show(const json& p, const CallContext&) {
  return discovery_->show(p);
}

Result<json> Manager::api_service_watch(const json& p, const CallContext& c) {
  return discovery_->watch(p, c);
}

}  // namespace weft::cp
