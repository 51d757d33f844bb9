#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "common/event.h"
#include "common/paths.h"
#include "common/rpc/session.h"
#include "common/tls.h"

namespace weft::rpc {

// Accepts sessions on Unix and TCP listeners. Owns its sessions and frees each one after
// it closes.
struct ServerLimits {
  // Sessions at once; 0 = the descriptor limit (RLIMIT_NOFILE) less a reserve of 64.
  size_t max_sessions = 0;
  // TCP sessions from one source address at once.
  size_t max_sessions_per_address = 256;
  // Bytes of unfinished input lines held across all sessions.
  size_t max_buffered_bytes = 64u << 20;
  // TLS: connections whose handshake is not finished, at once (more wait unaccepted in
  // the listen queue), and how long one may take.
  size_t max_handshaking = 256;
  uint64_t handshake_timeout_us = 10'000'000;
};

class Server {
 public:
  Server(EventLoop& loop, const Dispatcher* dispatcher, size_t max_line = kDefaultMaxLine,
         ServerLimits limits = {});
  ~Server();
  // Binds a Unix socket (replacing a stale one), chmods it to `mode` and, when
  // group_gid >= 0, chowns it to that group.
  Status listen_unix(const std::string& path, mode_t mode, int group_gid = -1);
  // Binds TCP; port 0 picks a free port (see tcp_port()).
  Status listen_tcp(const std::string& host, uint16_t port);
  // TLS on every TCP session from now on (Unix sessions keep their peer credentials).
  void set_tls(std::shared_ptr<tls::Context> ctx) { tls_ = std::move(ctx); }
  // Every session from now on shares this output gate (OutputGate).
  void set_output_gate(std::shared_ptr<OutputGate> gate) { gate_ = std::move(gate); }
  uint16_t tcp_port() const { return tcp_port_; }
  size_t session_count() const { return sessions_.size(); }
  std::function<void(Session&)> on_session;  // optional: runs for each new session

 private:
  void accept_on(int lfd, bool is_unix);
  // Out of descriptors: refuse the connection at the head of the queue with the spare
  // descriptor, or pause the listener briefly when even that is gone.
  void shed_connection(int lfd, size_t listener_index);
  // Pauses or resumes accepting on the TCP listeners (the handshake cap).
  void set_tcp_accepting(bool on);
  void handshake_done();
  void reap();
  EventLoop& loop_;
  const Dispatcher* dispatcher_;
  size_t max_line_;
  ServerLimits limits_;
  std::shared_ptr<OutputGate> gate_;
  std::shared_ptr<BufferBudget> budget_;
  Fd spare_fd_;
  std::map<std::string, size_t> per_address_;
  Source resume_timer_;
  uint64_t last_shed_log_us_ = 0;
  uint64_t shed_since_log_ = 0;
  std::vector<std::pair<Fd, Source>> listeners_;
  std::vector<size_t> tcp_listeners_;  // indices into listeners_
  bool accepting_tcp_ = true;
  std::vector<std::string> unix_paths_;
  std::map<Session*, std::unique_ptr<Session>> sessions_;
  Source reaper_;
  uint16_t tcp_port_ = 0;
  std::shared_ptr<tls::Context> tls_;
  size_t handshaking_ = 0;
};

}  // namespace weft::rpc
