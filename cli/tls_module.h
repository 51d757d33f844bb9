// weftctl's TLS lives in a module of its own, weftctl-tls.so, that weftctl opens only
// when an endpoint is tls://: OpenSSL (~100 page faults of relocations on every start)
// is then loaded by the commands that speak TLS, not by every command
// (docs/decisions.md, issue 18).
#pragma once

#include <string>

#include "common/result.h"
#include "common/rpc.h"
#include "common/tls.h"

namespace weft::cli {

struct TlsModule {
  // WEFT_BUILD_ID: weftctl and the module must come from one build (they share C++ types).
  const char* build;
  // The client's TLS with the operator's certificate, key and CA bundle.
  Result<rpc::ClientTls> (*client_tls)(const tls::Config& config, const std::string& server_name);
};

// The module's one exported function: extern "C" const TlsModule* weft_tls_module_v1().
inline constexpr const char* kTlsModuleEntry = "weft_tls_module_v1";

// Opens weftctl-tls.so once: next to the weftctl that runs (a build tree), else where
// the packages install it (WEFT_TLS_MODULE_PATH). Errors say where it looked and why.
Result<const TlsModule*> load_tls_module();

}  // namespace weft::cli
