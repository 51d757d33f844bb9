#include "cli/cli_config.h"

#include "common/config.h"

namespace weft {

Result<CliConfig> parse_cli_config(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(t, "", {"controlplane", "tls_ca", "tls_cert", "tls_key", "tls_server_name"}));
  CliConfig c;
  TRY(doc.read_strings(t, {{"controlplane", &c.controlplane},
                           {"tls_ca", &c.tls_ca},
                           {"tls_cert", &c.tls_cert},
                           {"tls_key", &c.tls_key},
                           {"tls_server_name", &c.tls_server_name}}));
  return c;
}

}  // namespace weft
