// weftctl-tls.so: the module weftctl opens for tls:// endpoints (tls_module.h). It
// carries its own copies of the few weft-common files it needs, compiled for a shared
// object, and exports one function.
#include "cli/tls_module.h"

namespace weft::cli {
namespace {

Result<rpc::ClientTls> make_client_tls(const tls::Config& config, const std::string& server_name) {
  TRY_ASSIGN(auto ctx, tls::Context::create(config, tls::Role::kClient));
  return rpc::client_tls(std::move(ctx), server_name);
}

const TlsModule kModule{WEFT_BUILD_ID, &make_client_tls};

}  // namespace
}  // namespace weft::cli

extern "C" __attribute__((visibility("default"))) const weft::cli::TlsModule* weft_tls_module_v1() {
  return &weft::cli::kModule;
}
