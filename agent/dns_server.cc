#include "agent/dns_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstring>

#include "common/log.h"
#include "common/rpc.h"

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
  s->fd_ = Fd(::socket(res->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int rc = s->fd_.valid() ? ::bind(s->fd_.get(), res->ai_addr, res->ai_addrlen) : -1;
  freeaddrinfo(res);
  if (rc != 0) return sys_error("dns_listen " + listen);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(s->fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0)
    s->port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  DnsServer* self = s.get();
  TRY_ASSIGN(s->io_, loop.add_io(s->fd_.get(), EPOLLIN, [self](uint32_t) { self->on_readable(); }));
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
    std::vector<uint8_t> answer =
        dns::respond(buf, size, *catalog_, options_, dns::udp_limit(buf, size), rotate_++);
    if (answer.empty()) continue;
    (void)::sendto(fd_.get(), answer.data(), answer.size(), MSG_DONTWAIT,
                   reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

}  // namespace weft::agent
