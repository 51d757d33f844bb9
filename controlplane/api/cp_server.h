// The control plane's listening side: its method table, the Unix socket and the TCP
// listener (mutual TLS when configured; certificates, key and CRL read again on SIGHUP),
// the output gate that group commits hold replies behind, and the web view's listener.
// What it serves is the Manager's (or, for a front end, the FrontEnd's) methods.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/metrics.h"
#include "common/rpc/server.h"
#include "common/tls.h"
#include "controlplane/daemon/cp_conf.h"

namespace weft::cp {

class CpServer {
 public:
  explicit CpServer(EventLoop& loop) : loop_(loop) {}
  // Closes every session first: their close watchers reach into the state of whoever
  // owns this server, which must call close() before that state goes.
  void close() { server_.reset(); }
  rpc::Dispatcher& methods() { return methods_; }
  const rpc::Dispatcher& methods() const { return methods_; }
  rpc::OutputGate& gate() { return *gate_; }
  // Listens on cfg.socket (group cfg.socket_group) and cfg.listen. With TLS resumption
  // the ticket key is made in the state directory (cfg.tls.ticket_key_file is set).
  // `also_reload`: what else SIGHUP reads again (a front end's links to its shards).
  Status listen(CpConfig& cfg, std::function<Status()> also_reload = {});
  // The read-only web view on `listen`: `page()` for "/" (docs/web-view.md).
  Status serve_web(const std::string& listen, const std::vector<std::string>& hosts,
                   std::function<std::string()> page);
  // The sockets' group's number (-1 unknown): callers in it are operators.
  int socket_gid() const { return gid_; }
  bool tls() const { return tls_ != nullptr; }
  int tcp_port() const { return server_ ? server_->tcp_port() : 0; }
  size_t session_count() const { return server_ ? server_->session_count() : 0; }

 private:
  void reload_tls(const std::string& ticket_key_file, const std::function<Status()>& also);
  EventLoop& loop_;
  rpc::Dispatcher methods_;
  std::shared_ptr<rpc::OutputGate> gate_ = std::make_shared<rpc::OutputGate>();
  std::shared_ptr<tls::Context> tls_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<metrics::HttpServer> web_;
  Source sighup_;
  int gid_ = -1;
};

}  // namespace weft::cp
