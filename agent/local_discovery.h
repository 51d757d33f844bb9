// The agent's side of service discovery (docs/services.md): its copy of the endpoints
// the control plane pushes (service.update), the DNS server that answers from it
// (agent.toml's dns_listen), and the jobs it asked the control plane about
// (ServiceInterest: a query for a job not asked about before waits while it asks).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/agent_conf.h"
#include "agent/dns_server.h"
#include "agent/service_interest.h"
#include "common/event.h"
#include "common/metrics.h"
#include "common/result.h"
#include "common/services.h"

namespace weft::agent {

class LocalDiscovery {
 public:
  // DNS on cfg.dns_listen when set; told of the jobs its clients ask for unless
  // cfg.dns_all_services. `ask` sends service.interest (false: no control plane now).
  static Result<std::unique_ptr<LocalDiscovery>> start(EventLoop& loop, const AgentConfig& cfg,
                                                       ServiceInterest::Ask ask);
  bool answers_dns() const { return dns_ != nullptr; }
  // service.update: applied in order; the answer ({"version"}) is the acknowledgement a
  // stop elsewhere waits for.
  Result<nlohmann::json> update(const nlohmann::json& params);
  // The jobs to name when registering (discovery_interest); nothing: every job.
  std::optional<std::vector<std::string>> interest() const;
  void write_metrics(metrics::Writer& w) const;

 private:
  LocalDiscovery() = default;
  ServiceCatalog catalog_;
  std::unique_ptr<DnsServer> dns_;
  std::unique_ptr<ServiceInterest> interest_;  // null: told of every job
};

}  // namespace weft::agent
