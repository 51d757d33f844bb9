// weftctl-tls's side of tls_helper.h: the TLS is made here, with OpenSSL.
#include <cstdlib>
#include <cstring>

#include "cli/tls_helper.h"

namespace weft::cli {

void remember_command_line(int /*argc*/, char** /*argv*/) {}

Result<rpc::ClientTls> client_tls(const tls::Config& config, const std::string& server_name) {
  TRY_ASSIGN(auto ctx, tls::Context::create(config, tls::Role::kClient));
  return rpc::client_tls(std::move(ctx), server_name);
}

Status check_tls_helper_build() {
  const char* from = std::getenv("WEFTCTL_BUILD_ID");
  if (!from || std::strcmp(from, WEFT_BUILD_ID) == 0) return {};
  return make_error(std::string("weftctl-tls comes from another build of weft (") + WEFT_BUILD_ID +
                    ", weftctl " + from + "): reinstall the weft package");
}

}  // namespace weft::cli
