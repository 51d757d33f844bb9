#include "controlplane/api/cp_server.h"

#include <csignal>

#include "common/fs.h"
#include "common/log.h"
#include "common/rpc/endpoint.h"

namespace weft::cp {

Status CpServer::listen(CpConfig& cfg, std::function<Status()> also_reload) {
  gid_ = group_gid(cfg.socket_group);
  server_ = std::make_unique<rpc::Server>(loop_, &methods_);
  server_->set_output_gate(gate_);
  TRY(server_->listen_unix(cfg.socket, 0660, gid_));
  if (!cfg.listen.empty()) {
    if (cfg.tls.enabled()) {
      if (cfg.tls_resumption) {
        cfg.tls.ticket_key_file = cfg.state_dir + "/tls-ticket.key";
        if (!path_exists(cfg.tls.ticket_key_file))
          TRY(tls::write_ticket_key(cfg.tls.ticket_key_file));
      }
      TRY_ASSIGN(tls_, tls::Context::create(cfg.tls, tls::Role::kServer));
      server_->set_tls(tls_);
    }
    TRY_ASSIGN(auto ep, rpc::parse_endpoint(cfg.listen));
    TRY(server_->listen_tcp(ep.host, ep.port));
  }
  // SIGHUP (systemctl reload): certificates, key and CRL are read again; new handshakes
  // use them, sessions already up carry on.
  TRY_ASSIGN(sighup_, loop_.add_signal(
                          SIGHUP, [this, ticket = cfg.tls.ticket_key_file,
                                   also = std::move(also_reload)] { reload_tls(ticket, also); }));
  return {};
}

void CpServer::reload_tls(const std::string& ticket_key_file, const std::function<Status()>& also) {
  if (also)
    if (auto s = also(); !s.ok())
      log_error("SIGHUP: TLS files not reloaded for the outgoing links: " + s.error().str());
  if (!tls_) {
    log_info(also ? "SIGHUP: outgoing links reloaded" : "SIGHUP: nothing to reload");
    return;
  }
  // A new ticket key first: sessions resumed from now on were verified under the files
  // read now (a certificate revoked by the new CRL cannot resume).
  if (!ticket_key_file.empty())
    if (auto s = tls::write_ticket_key(ticket_key_file); !s.ok())
      log_error("SIGHUP: no new TLS ticket key: " + s.error().str());
  if (auto s = tls_->reload(); !s.ok())
    log_error("SIGHUP: TLS files not reloaded; the previous ones stay in use: " + s.error().str());
  else
    log_info("SIGHUP: TLS certificates, key and CRL reloaded");
}

Status CpServer::serve_web(const std::string& listen, const std::vector<std::string>& hosts,
                           std::function<std::string()> page) {
  auto web = metrics::HttpServer::start(loop_, listen, nullptr);
  if (!web.ok()) return std::move(web).error().wrap("web_listen");
  web_ = std::move(web).value();
  web_->set_allowed_hosts(hosts);
  web_->set_pages(
      [page = std::move(page)](const std::string& url, std::string* type, std::string* body) {
        if (url != "/" && url != "/index.html") return false;
        *type = "text/html; charset=utf-8";
        *body = page();
        return true;
      });
  log_info("web view", {{"LISTEN", web_->address()}});
  return {};
}

}  // namespace weft::cp
