// weftctl's own configuration: where the control plane is and which certificate speaks
// for the operator.
#include <cstdlib>

#include "cli/util.h"
#include "common/cli_config.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/tls.h"

namespace weft::cli {

Status load_cli_config(Globals& g) {
  std::string path;  // the file to read ($WEFTCTL_CONFIG must exist; the others may not)
  if (const char* e = std::getenv("WEFTCTL_CONFIG"); e && *e) {
    path = e;
  } else if (const char* home = std::getenv("HOME");
             home && *home && path_exists(std::string(home) + "/.config/weft/weftctl.toml")) {
    path = std::string(home) + "/.config/weft/weftctl.toml";
  } else if (path_exists("/etc/weft/weftctl.toml")) {
    path = "/etc/weft/weftctl.toml";
  }
  if (!path.empty()) {
    TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
    TRY_ASSIGN(CliConfig file, parse_cli_config(text, path));
    for (auto [from, to] : {std::pair{&file.controlplane, &g.controlplane},
                            {&file.tls_ca, &g.tls_ca},
                            {&file.tls_cert, &g.tls_cert},
                            {&file.tls_key, &g.tls_key},
                            {&file.tls_server_name, &g.tls_server_name}})
      if (!from->empty()) *to = *from;
  }
  for (auto [var, out] : {std::pair{"WEFT_CONTROLPLANE", &g.controlplane},
                          {"WEFT_TLS_CA", &g.tls_ca},
                          {"WEFT_TLS_CERT", &g.tls_cert},
                          {"WEFT_TLS_KEY", &g.tls_key},
                          {"WEFT_TLS_SERVER_NAME", &g.tls_server_name}})
    if (const char* e = std::getenv(var); e && *e) *out = e;
  return {};
}

std::unique_ptr<rpc::Client> connect_controlplane(const Globals& g) {
  bool tcp = g.controlplane.rfind("tls://", 0) == 0;
  if (!tcp) {
    auto ep = rpc::parse_endpoint(g.controlplane);
    tcp = ep.ok() && !ep->is_unix;
  }
  if (!tcp) return connect_or_die(g.controlplane, "weft-controlplane", "--controlplane");
  if (g.tls_cert.empty() || g.tls_key.empty() || g.tls_ca.empty())
    die("the control plane at " + g.controlplane +
        " is TCP: give a certificate, key and CA bundle (--tls-cert, --tls-key, --tls-ca; "
        "WEFT_TLS_CERT, WEFT_TLS_KEY, WEFT_TLS_CA; or weftctl.toml)");
  tls::Config cfg{g.tls_ca, g.tls_cert, g.tls_key, ""};
  auto ctx = tls::Context::create(cfg, tls::Role::kClient);
  if (!ctx.ok()) die(ctx.error().str());
  rpc::ClientTls t{*ctx, g.tls_server_name};
  auto c = rpc::Client::connect(g.controlplane, rpc::kDefaultMaxLine, &t);
  if (!c.ok()) die(c.error().str() + " (is weft-controlplane listening there? --controlplane)");
  return std::move(c).value();
}

}  // namespace weft::cli
