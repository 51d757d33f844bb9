// The agent's DNS answers for service discovery (docs/services.md): a UDP socket on the
// agent's event loop, answered from its copy of the endpoints (common/dns.h). It keeps
// answering while the control plane is away: the copy is what the control plane last
// pushed.
#pragma once

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
  const ServiceCatalog* catalog_;
  dns::Options options_;
  Fd fd_;
  Source io_;
  uint64_t queries_ = 0;
  uint32_t rotate_ = 0;
  uint16_t port_ = 0;
};

}  // namespace weft::agent
