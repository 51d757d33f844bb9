#include "agent/dns_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/endpoint.h"

namespace weft::agent {

Result<std::unique_ptr<DnsServer>> DnsServer::serve(EventLoop& loop, const std::string& listen,
                                                    const ServiceCatalog* catalog,
                                                    dns::Options options) {
  TRY_ASSIGN(rpc::Endpoint ep, rpc::parse_endpoint(listen));
  if (ep.is_unix) return field_error("dns_listen", "must be host:port");
  std::string host = ep.host;
  if (host.size() > 1 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(ep.port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      rc != 0 || !res)
    return field_error("dns_listen", listen + ": " + gai_strerror(rc));
  std::unique_ptr<DnsServer> s(new DnsServer(catalog, options));
  s->loop_ = &loop;
  s->fd_ = Fd(::socket(res->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int rc = s->fd_.valid() ? ::bind(s->fd_.get(), res->ai_addr, res->ai_addrlen) : -1;
  // TCP on the port UDP got (the same one, also when "port 0" asked for any).
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (rc == 0) rc = ::getsockname(s->fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  if (rc == 0) {
    s->port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    s->tcp_fd_ = Fd(::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    if (s->tcp_fd_.valid())
      (void)::setsockopt(s->tcp_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    rc = s->tcp_fd_.valid() &&
                 ::bind(s->tcp_fd_.get(), reinterpret_cast<sockaddr*>(&bound), len) == 0 &&
                 ::listen(s->tcp_fd_.get(), 64) == 0
             ? 0
             : -1;
  }
  freeaddrinfo(res);
  if (rc != 0) return sys_error("dns_listen " + listen);
  DnsServer* self = s.get();
  TRY_ASSIGN(s->io_, loop.add_io(s->fd_.get(), EPOLLIN, [self](uint32_t) { self->on_readable(); }));
  TRY_ASSIGN(s->tcp_io_,
             loop.add_io(s->tcp_fd_.get(), EPOLLIN, [self](uint32_t) { self->on_accept(); }));
  s->sweep();
  log_info("answering DNS for the weft. zone", {{"LISTEN", listen}});
  return s;
}

void DnsServer::on_readable() {
  // A bounded number of packets per wake-up: a flood cannot keep the loop here.
  for (int i = 0; i < 64; ++i) {
    uint8_t buf[4096];
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    ssize_t n =
        ::recvfrom(fd_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return;  // EAGAIN: nothing more now (errors are per datagram on UDP)
    ++queries_;
    const auto size = static_cast<size_t>(n);
    if (wait(buf, size, &from, from_len, -1)) continue;
    std::vector<uint8_t> answer =
        dns::respond(buf, size, *catalog_, options_, dns::udp_limit(buf, size), rotate_++);
    if (answer.empty()) continue;
    (void)::sendto(fd_.get(), answer.data(), answer.size(), MSG_DONTWAIT,
                   reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

namespace {
constexpr size_t kMaxTcpConnections = 64;
constexpr size_t kMaxTcpPerSource = 16;
constexpr uint64_t kTcpIdleUs = 10'000'000;
constexpr uint64_t kTcpQueryUs = 3'000'000;  // a query's bytes must all come in this time
constexpr uint64_t kSweepUs = 500'000;

std::string peer_address(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}
}  // namespace

void DnsServer::make_room(const std::string& source) {
  size_t from_source = 0;
  for (const auto& [fd, c] : tcp_) from_source += c->source == source;
  bool per_source = from_source >= kMaxTcpPerSource;
  if (!per_source && tcp_.size() < kMaxTcpConnections) return;
  auto oldest = tcp_.end();
  for (auto it = tcp_.begin(); it != tcp_.end(); ++it)
    if ((!per_source || it->second->source == source) &&
        (oldest == tcp_.end() || it->second->last_us < oldest->second->last_us))
      oldest = it;
  if (oldest != tcp_.end()) tcp_.erase(oldest);
}

void DnsServer::on_accept() {
  for (int i = 0; i < 16; ++i) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    Fd c(::accept4(tcp_fd_.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len,
                   SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) return;
    std::string source = peer_address(peer);
    make_room(source);
    int fd = c.get();
    auto conn = std::make_unique<TcpConn>();
    conn->fd = std::move(c);
    conn->source = std::move(source);
    conn->last_us = now_monotonic_us();
    conn->serial = ++tcp_serial_;
    auto io = loop_->add_io(fd, EPOLLIN, [this, fd](uint32_t) { on_tcp(fd); });
    if (!io.ok()) continue;
    conn->io = std::move(io).value();
    tcp_[fd] = std::move(conn);
  }
}

void DnsServer::on_tcp(int fd) {
  auto it = tcp_.find(fd);
  if (it == tcp_.end()) return;
  TcpConn& c = *it->second;
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  bool close_it = n <= 0;
  if (n > 0) {
    // Bytes alone earn no time: the query they begin must be whole within kTcpQueryUs.
    if (c.in.empty()) c.partial_us = now_monotonic_us();
    c.in.append(buf, static_cast<size_t>(n));
  }
  // Each message: a two-byte length, then the message (RFC 1035 4.2.2, RFC 7766).
  while (!close_it && c.in.size() >= 2) {
    size_t len =
        (static_cast<size_t>(static_cast<uint8_t>(c.in[0])) << 8) | static_cast<uint8_t>(c.in[1]);
    if (c.in.size() < 2 + len) break;
    ++queries_;
    const auto* q = reinterpret_cast<const uint8_t*>(c.in.data()) + 2;
    std::vector<uint8_t> answer;
    // (Answers on a connection may come out of order: RFC 7766 6.2.1.1.)
    if (!wait(q, len, nullptr, 0, fd))
      answer = dns::respond(q, len, *catalog_, options_, 65535, rotate_++);
    c.in.erase(0, 2 + len);
    c.last_us = now_monotonic_us();
    c.partial_us = c.in.empty() ? 0 : c.last_us;
    if (answer.empty()) continue;
    send_tcp(fd, answer);
    if (!tcp_.count(fd)) return;  // dropped: it does not read
  }
  if (close_it) tcp_.erase(it);
}

void DnsServer::send_tcp(int fd, const std::vector<uint8_t>& answer) {
  auto it = tcp_.find(fd);
  if (it == tcp_.end()) return;
  std::string out;
  out.push_back(static_cast<char>(answer.size() >> 8));
  out.push_back(static_cast<char>(answer.size() & 0xff));
  out.append(reinterpret_cast<const char*>(answer.data()), answer.size());
  // A client that does not read what it asked for is dropped, not buffered for.
  if (::send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL) !=
      static_cast<ssize_t>(out.size()))
    tcp_.erase(it);
}

bool DnsServer::wait(const uint8_t* data, size_t n, const sockaddr_storage* from,
                     socklen_t from_len, int tcp_fd) {
  if (!must_wait_ || waiting_.size() >= kMaxWaiting) return false;
  auto job = dns::asked_job(data, n);
  if (!job || !must_wait_(*job)) return false;
  Waiting w;
  w.packet.assign(data, data + n);
  w.job = std::move(*job);
  if (from) {
    w.from = *from;
    w.from_len = from_len;
  }
  w.tcp_fd = tcp_fd;
  if (auto c = tcp_.find(tcp_fd); c != tcp_.end()) w.tcp_serial = c->second->serial;
  w.deadline_us = now_monotonic_us() + kWaitUs;
  waiting_.push_back(std::move(w));
  ++waited_;
  if (!wait_timer_.active()) {
    auto t = loop_->add_timer_in(kWaitUs, [this] {
      wait_timer_.reset();
      answer_waiting(true);
    });
    if (t.ok()) wait_timer_ = std::move(t).value();
  }
  return true;
}

void DnsServer::answered() {
  answer_waiting(false);
}

void DnsServer::answer_waiting(bool deadlines) {
  uint64_t now = now_monotonic_us();
  std::vector<Waiting> keep;
  std::vector<Waiting> due;
  for (auto& w : waiting_) {
    bool go = (deadlines && now >= w.deadline_us) || !must_wait_ || !must_wait_(w.job);
    (go ? due : keep).push_back(std::move(w));
  }
  waiting_ = std::move(keep);
  for (const auto& w : due) {
    if (w.tcp_fd < 0) {
      auto answer = dns::respond(w.packet.data(), w.packet.size(), *catalog_, options_,
                                 dns::udp_limit(w.packet.data(), w.packet.size()), rotate_++);
      if (!answer.empty())
        (void)::sendto(fd_.get(), answer.data(), answer.size(), MSG_DONTWAIT,
                       reinterpret_cast<const sockaddr*>(&w.from), w.from_len);
    } else if (auto c = tcp_.find(w.tcp_fd); c != tcp_.end() && c->second->serial == w.tcp_serial) {
      auto answer =
          dns::respond(w.packet.data(), w.packet.size(), *catalog_, options_, 65535, rotate_++);
      if (!answer.empty()) send_tcp(w.tcp_fd, answer);
    }
  }
  if (!waiting_.empty() && !wait_timer_.active()) {
    uint64_t next = waiting_.front().deadline_us;
    for (const auto& w : waiting_) next = std::min(next, w.deadline_us);
    auto t = loop_->add_timer_at(next, [this] {
      wait_timer_.reset();
      answer_waiting(true);
    });
    if (t.ok()) wait_timer_ = std::move(t).value();
  }
}

void DnsServer::sweep() {
  uint64_t now = now_monotonic_us();
  for (auto it = tcp_.begin(); it != tcp_.end();) {
    const TcpConn& c = *it->second;
    bool stale = c.partial_us ? now - c.partial_us > kTcpQueryUs : now - c.last_us > kTcpIdleUs;
    it = stale ? tcp_.erase(it) : std::next(it);
  }
  auto t = loop_->add_timer_in(kSweepUs, [this] { sweep(); });
  if (t.ok()) sweep_ = std::move(t).value();
}

}  // namespace weft::agent
