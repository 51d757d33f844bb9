// Listeners, their limits and the sessions they accept (server.h).
#include "common/rpc/server.h"
#include "common/rpc/client.h"

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/resource.h>

#include <cstring>
#include <thread>
#include <utility>

#include <simdjson.h>

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc/detail.h"

namespace weft::rpc {

using namespace detail;

// ---- Server ----

Server::Server(EventLoop& loop, const Dispatcher* dispatcher, size_t max_line, ServerLimits limits)
    : loop_(loop),
      dispatcher_(dispatcher),
      max_line_(max_line),
      limits_(limits),
      budget_(std::make_shared<BufferBudget>()),
      spare_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
  budget_->limit = limits_.max_buffered_bytes;
  if (limits_.max_sessions == 0) {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    limits_.max_sessions = rl.rlim_cur > 128 ? static_cast<size_t>(rl.rlim_cur) - 64 : 64;
  }
}

Server::~Server() {
  sessions_.clear();
  listeners_.clear();
  for (const auto& p : unix_paths_) ::unlink(p.c_str());
}

Status Server::listen_unix(const std::string& path, mode_t mode, int group_gid) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return make_error("socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return sys_error("socket");
  TRY(mkdir_p(dirname_of(path), 0755));
  // A socket file left by a killed predecessor: replace it, but never steal a live one.
  if (path_exists(path)) {
    auto probe = connect_endpoint(Endpoint{true, path, "", 0});
    if (probe.ok()) return make_error("another process is already serving " + path);
    ::unlink(path.c_str());
  }
  mode_t old = ::umask(0177);
  int r = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  ::umask(old);
  if (r < 0) return sys_error("bind " + path);
  if (group_gid >= 0 &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(group_gid)) < 0)
    return sys_error("chown " + path);
  if (::chmod(path.c_str(), mode) < 0) return sys_error("chmod " + path);
  if (::listen(fd.get(), 512) < 0) return sys_error("listen " + path);
  int lfd = fd.get();
  TRY_ASSIGN(Source src,
             loop_.add_io(lfd, EPOLLIN, [this, lfd](uint32_t) { accept_on(lfd, true); }));
  listeners_.emplace_back(std::move(fd), std::move(src));
  unix_paths_.push_back(path);
  return {};
}

Status Server::listen_tcp(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string ps = std::to_string(port);
  int r = ::getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (r != 0) return make_error("resolve " + host + ": " + gai_strerror(r));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  Fd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return sys_error("socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) < 0)
    return sys_error("bind " + host + ":" + ps);
  // A deep queue: after a control-plane restart every machine connects at once, and
  // connections wait here (no state in the daemon) while handshakes are capped.
  if (::listen(fd.get(), 4096) < 0) return sys_error("listen");
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl);
  tcp_port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  int lfd = fd.get();
  TRY_ASSIGN(Source src,
             loop_.add_io(lfd, EPOLLIN, [this, lfd](uint32_t) { accept_on(lfd, false); }));
  listeners_.emplace_back(std::move(fd), std::move(src));
  tcp_listeners_.push_back(listeners_.size() - 1);
  return {};
}

void Server::set_tcp_accepting(bool on) {
  if (accepting_tcp_ == on) return;
  accepting_tcp_ = on;
  for (size_t i : tcp_listeners_)
    (void)listeners_[i].second.set_io_events(on ? uint32_t{EPOLLIN} : 0u);
}

void Server::handshake_done() {
  --handshaking_;
  if (!accepting_tcp_ && handshaking_ < limits_.max_handshaking) set_tcp_accepting(true);
}

void Server::accept_on(int lfd, bool is_unix) {
  for (;;) {
    if (!is_unix && tls_ && handshaking_ >= limits_.max_handshaking) {
      // Enough unfinished handshakes: the rest wait in the kernel's queue (nothing held
      // for them here) until one finishes or times out.
      set_tcp_accepting(false);
      return;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    int c = ::accept4(lfd, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        size_t index = 0;
        while (index < listeners_.size() && listeners_[index].first.get() != lfd) ++index;
        shed_connection(lfd, index);
      } else if (errno != EAGAIN) {
        log_warn(std::string("accept failed: ") + std::strerror(errno));
      }
      return;
    }
    Fd fd(c);
    Peer peer;
    peer.is_unix = is_unix;
    if (is_unix) {
      ucred cred{};
      socklen_t cl = sizeof cred;
      if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
        peer.pid = cred.pid;
        peer.uid = cred.uid;
        peer.gid = cred.gid;
      }
      gid_t groups[256];
      socklen_t gl = sizeof groups;
      if (getsockopt(c, SOL_SOCKET, SO_PEERGROUPS, groups, &gl) == 0)
        peer.groups.assign(groups, groups + gl / sizeof(gid_t));
      peer.address = "unix";
    } else {
      char host[INET6_ADDRSTRLEN] = "?";
      uint16_t port = 0;
      if (ss.ss_family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
      }
      peer.host = host;
      peer.address = std::string(host) + ":" + std::to_string(port);
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    const char* refused = nullptr;
    bool tls = !is_unix && tls_;
    if (sessions_.size() >= limits_.max_sessions)
      refused = "too many sessions";
    else if (!is_unix && per_address_[peer.host] >= limits_.max_sessions_per_address)
      refused = "too many sessions from one address";
    if (refused) {
      // Closing at once is the answer: the peer sees the connection end.
      uint64_t now = now_monotonic_us();
      ++shed_since_log_;
      if (now - last_shed_log_us_ > 5'000'000) {
        log_warn(std::string("refusing connections: ") + refused,
                 {{"PEER", peer.address}, {"REFUSED", std::to_string(shed_since_log_)}});
        last_shed_log_us_ = now;
        shed_since_log_ = 0;
      }
      continue;
    }
    SSL* ssl = nullptr;
    if (tls) {
      auto r = tls_->new_ssl(fd.get(), "");
      if (!r.ok()) {
        log_warn("refusing a connection: " + r.error().str(), {{"PEER", peer.address}});
        continue;
      }
      ssl = *r;
    }
    auto s = std::make_unique<Session>(loop_, std::move(fd), peer, dispatcher_, max_line_, budget_);
    Session* raw = s.get();
    if (gate_) raw->set_output_gate(gate_);
    if (ssl) {
      // No state for the peer beyond the handshake until it is authenticated.
      raw->use_tls(ssl, limits_.handshake_timeout_us);
      ++handshaking_;
      auto counted = std::make_shared<bool>(true);
      raw->set_on_established([this, counted] {
        if (std::exchange(*counted, false)) handshake_done();
      });
      raw->watch_close([this, counted] {
        if (std::exchange(*counted, false)) handshake_done();
      });
    }
    raw->set_on_close([this] {
      // Free closed sessions outside of their own callbacks.
      if (!reaper_.active()) {
        auto d = loop_.add_defer([this] { reap(); });
        if (d.ok()) reaper_ = std::move(d).value();
      }
    });
    if (!raw->start().ok()) continue;
    if (!is_unix) ++per_address_[peer.host];
    sessions_[raw] = std::move(s);
    if (on_session) on_session(*raw);
  }
}

void Server::shed_connection(int lfd, size_t listener_index) {
  uint64_t now = now_monotonic_us();
  ++shed_since_log_;
  if (now - last_shed_log_us_ > 5'000'000) {
    log_warn("out of file descriptors: refusing connections (raise LimitNOFILE)",
             {{"REFUSED", std::to_string(shed_since_log_)}});
    last_shed_log_us_ = now;
    shed_since_log_ = 0;
  }
  if (spare_fd_.valid()) {
    // Free one descriptor, take the waiting connection and close it, then hold the
    // spare again: the queue drains instead of waking the loop forever.
    spare_fd_.reset();
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) ::close(c);
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (spare_fd_.valid()) return;
  }
  // No spare either: stop watching the listener for a moment.
  if (listener_index >= listeners_.size() || resume_timer_.active()) return;
  (void)listeners_[listener_index].second.set_io_events(0);
  auto t = loop_.add_timer_in(200'000, [this, listener_index] {
    resume_timer_.reset();
    if (!spare_fd_.valid()) spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    bool tcp = std::find(tcp_listeners_.begin(), tcp_listeners_.end(), listener_index) !=
               tcp_listeners_.end();
    if (listener_index < listeners_.size() && (accepting_tcp_ || !tcp))
      (void)listeners_[listener_index].second.set_io_events(EPOLLIN);
  });
  if (t.ok()) resume_timer_ = std::move(t).value();
}

void Server::reap() {
  reaper_.reset();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->first->closed()) {
      const Peer& p = it->first->peer();
      if (!p.is_unix) {
        auto pa = per_address_.find(p.host);
        if (pa != per_address_.end() && --pa->second == 0) per_address_.erase(pa);
      }
      it = sessions_.erase(it);
    } else
      ++it;
  }
}

}  // namespace weft::rpc
