// The agent's DNS answers for service discovery (docs/services.md): a UDP socket and a
// TCP listener (RFC 7766: two-byte length before each message; for answers larger than
// UDP carries) on the agent's event loop, answered from its copy of the endpoints
// (common/dns.h). It keeps answering while the control plane is away: the copy is what
// the control plane last pushed. TCP is bounded: 64 connections, 10 s idle, a client that
// does not read its answers is dropped.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/dns.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/result.h"

namespace weft::agent {

class DnsServer {
 public:
  // Listens on `listen` ("host:port"); answers from `catalog`, which must outlive it.
  static Result<std::unique_ptr<DnsServer>> serve(EventLoop& loop, const std::string& listen,
                                                  const ServiceCatalog* catalog,
                                                  dns::Options options);
  uint64_t queries() const { return queries_; }
  uint16_t port() const { return port_; }

 private:
  DnsServer(const ServiceCatalog* catalog, dns::Options o) : catalog_(catalog), options_(o) {}
  void on_readable();
  void on_accept();
  void on_tcp(int fd);
  void sweep();
  const ServiceCatalog* catalog_;
  dns::Options options_;
  EventLoop* loop_ = nullptr;
  Fd fd_, tcp_fd_;
  Source io_, tcp_io_, sweep_;
  struct TcpConn {
    Fd fd;
    Source io;
    std::string in;
    uint64_t last_us = 0;
  };
  std::map<int, std::unique_ptr<TcpConn>> tcp_;
  uint64_t queries_ = 0;
  uint32_t rotate_ = 0;
  uint16_t port_ = 0;
};

}  // namespace weft::agent
