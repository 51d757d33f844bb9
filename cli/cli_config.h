// weftctl.toml: where the control plane is and which certificate speaks for the
// operator (docs/configuration.md). Read by weftctl; here so that the docs' examples
// are checked by the same parser.
#pragma once

#include <string>

#include "common/result.h"

namespace weft {

struct CliConfig {
  std::string controlplane;  // a socket path or tls://host:port ("" = not set)
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
};

// Errors name the file and line. Keys not set stay empty.
Result<CliConfig> parse_cli_config(const std::string& text, const std::string& name);

}  // namespace weft
