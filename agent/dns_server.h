// The agent's DNS answers for service discovery (docs/services.md): a UDP socket and a
// TCP listener (RFC 7766: two-byte length before each message; for answers larger than
// UDP carries) on the agent's event loop, answered from its copy of the endpoints
// (common/dns.h). It keeps answering while the control plane is away: the copy is what
// the control plane last pushed. TCP is bounded (RFC 7766 section 6.2): 64 connections,
// 16 from one address; a connection is closed 10 s after its last whole query, or 3 s
// after a query began arriving and did not complete, and a client that does not read
// its answers is dropped. When every slot is taken, a new connection takes the slot of
// the one whose last whole query is oldest (from the same address first, when that
// address is at its share): clients that trickle bytes and never finish a query
// (slowloris) are the first to go, and a fresh query always gets in.
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
    std::string source;       // the peer's address, without its port
    uint64_t last_us = 0;     // connected, or its last whole query answered
    uint64_t partial_us = 0;  // when the query now arriving began; 0: none
  };
  // Makes room for a connection from `source`: closes the oldest (by last_us) of that
  // address's when it has its share, else of all when every slot is taken.
  void make_room(const std::string& source);
  std::map<int, std::unique_ptr<TcpConn>> tcp_;
  uint64_t queries_ = 0;
  uint32_t rotate_ = 0;
  uint16_t port_ = 0;
};

}  // namespace weft::agent
