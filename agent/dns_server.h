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

#include <sys/socket.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

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
  // A query for a job the agent has not asked the control plane about waits (at most
  // kWaitUs, at most kMaxWaiting at once) while `must_wait(job)` says so; answered()
  // answers those that need not wait any more. Without it, every query is answered at once.
  using MustWait = std::function<bool(const std::string& job)>;
  void hold_while(MustWait must_wait) { must_wait_ = std::move(must_wait); }
  void answered();
  static constexpr uint64_t kWaitUs = 1'000'000;
  static constexpr size_t kMaxWaiting = 256;
  uint64_t queries() const { return queries_; }
  uint64_t waited() const { return waited_; }
  uint16_t port() const { return port_; }

 private:
  DnsServer(const ServiceCatalog* catalog, dns::Options o) : catalog_(catalog), options_(o) {}
  void on_readable();
  void on_accept();
  void on_tcp(int fd);
  void sweep();
  // True when the query was taken to answer later (its job is being asked for).
  bool wait(const uint8_t* data, size_t n, const sockaddr_storage* from, socklen_t from_len,
            int tcp_fd);
  void answer_waiting(bool all_due);
  void send_tcp(int fd, const std::vector<uint8_t>& answer);
  const ServiceCatalog* catalog_;
  MustWait must_wait_;
  struct Waiting {
    std::vector<uint8_t> packet;
    std::string job;
    sockaddr_storage from{};
    socklen_t from_len = 0;
    int tcp_fd = -1;  // -1: UDP
    uint64_t tcp_serial = 0;
    uint64_t deadline_us = 0;
  };
  std::vector<Waiting> waiting_;
  Source wait_timer_;
  uint64_t waited_ = 0;
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
    uint64_t serial = 0;      // which connection (a closed one's fd number is reused)
  };
  // Makes room for a connection from `source`: closes the oldest (by last_us) of that
  // address's when it has its share, else of all when every slot is taken.
  void make_room(const std::string& source);
  std::map<int, std::unique_ptr<TcpConn>> tcp_;
  uint64_t queries_ = 0;
  uint32_t rotate_ = 0;
  uint64_t tcp_serial_ = 0;
  uint16_t port_ = 0;
};

}  // namespace weft::agent
