#include "agent/local_discovery.h"

namespace weft::agent {

using json = nlohmann::json;

Result<std::unique_ptr<LocalDiscovery>> LocalDiscovery::start(EventLoop& loop,
                                                              const AgentConfig& cfg,
                                                              ServiceInterest::Ask ask) {
  std::unique_ptr<LocalDiscovery> d(new LocalDiscovery());
  if (cfg.dns_listen.empty()) return d;
  auto dns = DnsServer::serve(loop, cfg.dns_listen, &d->catalog_, dns::Options{cfg.dns_ttl_s});
  if (!dns.ok()) return std::move(dns).error().wrap("dns_listen");
  d->dns_ = std::move(dns).value();
  if (cfg.dns_all_services) return d;
  // Told of the jobs its DNS clients ask for: a query for a new one waits while the
  // agent asks (docs/services.md "Interest").
  LocalDiscovery* self = d.get();
  d->interest_ = std::make_unique<ServiceInterest>(loop, d->catalog_, std::move(ask),
                                                   [self] { self->dns_->answered(); });
  d->dns_->hold_while([self](const std::string& job) { return self->interest_->must_wait(job); });
  return d;
}

Result<json> LocalDiscovery::update(const json& params) {
  TRY_ASSIGN(ServiceUpdate u, parse_service_update(params));
  if (interest_) interest_->filter(u);
  catalog_.apply(u);
  return json{{"version", catalog_.version()}};
}

std::optional<std::vector<std::string>> LocalDiscovery::interest() const {
  if (!interest_) return std::nullopt;
  return interest_->jobs();
}

void LocalDiscovery::write_metrics(metrics::Writer& w) const {
  w.family("weft_agent_dns_queries_total", "counter",
           "DNS packets received on dns_listen (docs/services.md).");
  w.sample("weft_agent_dns_queries_total", static_cast<double>(dns_ ? dns_->queries() : 0));
  w.family("weft_agent_dns_waited_total", "counter",
           "DNS queries that waited while the agent asked the control plane for their job.");
  w.sample("weft_agent_dns_waited_total", static_cast<double>(dns_ ? dns_->waited() : 0));
  w.family("weft_agent_dns_interests", "gauge",
           "Jobs this agent's DNS clients asked for that it is told of (docs/services.md "
           "\"Interest\").");
  w.sample("weft_agent_dns_interests", static_cast<double>(interest_ ? interest_->size() : 0));
  w.family("weft_agent_dns_forgotten_total", "counter",
           "Jobs forgotten because no client asked for them lately, or to make room.");
  w.sample("weft_agent_dns_forgotten_total",
           static_cast<double>(interest_ ? interest_->forgotten() : 0));
  w.family("weft_agent_discovery_version", "gauge",
           "The version of the service discovery copy this agent answers from.");
  w.sample("weft_agent_discovery_version", static_cast<double>(catalog_.version()));
}

}  // namespace weft::agent
