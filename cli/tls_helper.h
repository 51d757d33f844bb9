// weftctl's TLS lives in a program of its own, weftctl-tls (docs/decisions.md, issue
// 18). weftctl is a static PIE: no dynamic loader, no shared library, and so no OpenSSL,
// which it needs only for a control plane over TCP. For such an endpoint it executes
// weftctl-tls with its own command line; weftctl-tls is the same commands built with
// OpenSSL. Both are linked from the same objects; only this seam differs.
#pragma once

#include <string>

#include "common/result.h"
#include "common/rpc/client.h"
#include "common/tls.h"

namespace weft::cli {

// The command line as main() got it: what weftctl hands on to weftctl-tls.
void remember_command_line(int argc, char** argv);

// The client's TLS with the operator's certificate, key and CA bundle. In weftctl-tls,
// made here. In weftctl, this process is replaced by weftctl-tls with the same command
// line (found next to the running weftctl, as in a build tree, else where the packages
// install it, WEFT_TLS_HELPER_PATH; never through the environment, so no one can make a
// root weftctl run their program): it returns only an error, which says where it looked.
// Called before anything that changes state was sent, so the command is run once.
Result<rpc::ClientTls> client_tls(const tls::Config& config, const std::string& server_name);

// weftctl-tls: refuses to run for a weftctl of another build (WEFTCTL_BUILD_ID, set by
// weftctl when it hands over), whose commands and flags may differ. weftctl: nothing.
Status check_tls_helper_build();

}  // namespace weft::cli
