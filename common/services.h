// Service discovery's one schema (docs/services.md), shared by the control plane, which
// keeps each job's endpoints (its ready tasks) and pushes them to the agents, and the
// agents, which keep a copy and answer DNS from it, so that a control-plane outage does
// not stop name resolution.
//
// An endpoint: {"task": "web.3.17", "index": 3, "generation": 2, "machine": "m1",
//               "address": "10.0.0.5", "ports": {"http": 20001}}
// A service:   {"entitlement": "frontend", "endpoints": [endpoint, ...]} (index order)
// service.update (control plane -> agent): {"version": N, "reset": bool,
//               "services": {job: service, or null when the job is gone}}
// The agent applies updates in order ("reset": its copy is replaced by this and the
// following updates of the same version) and answers {"version": N}: that answer is the
// acknowledgement a stop waits for.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

struct Endpoint {
  std::string task;
  int index = 0;
  uint64_t generation = 0;
  std::string machine;
  std::string address;  // an IPv4 or IPv6 literal
  std::map<std::string, uint16_t> ports;
  bool operator==(const Endpoint&) const = default;
};

struct Service {
  std::string entitlement;
  std::vector<Endpoint> endpoints;  // by index
  bool operator==(const Service&) const = default;
};

// What one update may carry: bounded, so a hostile or broken peer cannot make an agent
// hold more than a region's worth.
inline constexpr size_t kMaxServicesPerUpdate = 100000;
inline constexpr size_t kMaxEndpointsPerService = 100000;

bool valid_ip_address(const std::string& s);

nlohmann::json to_json(const Endpoint& e);
nlohmann::json to_json(const Service& s);
// Errors name the field ("services.web.endpoints[2].address").
Result<Service> parse_service(const nlohmann::json& j, const std::string& field);

struct ServiceUpdate {
  uint64_t version = 0;
  bool reset = false;
  std::map<std::string, std::optional<Service>> services;  // nullopt: the job is gone
};
Result<ServiceUpdate> parse_service_update(const nlohmann::json& j);
nlohmann::json to_json(const ServiceUpdate& u);

// The agent's copy of every job's endpoints, and the lookups DNS needs.
class ServiceCatalog {
 public:
  void apply(const ServiceUpdate& u);
  // Drops the job's endpoints whatever the name's case (`job` in lower case); the version
  // stays.
  void forget(const std::string& job);
  uint64_t version() const { return version_; }
  size_t size() const { return services_.size(); }
  const std::map<std::string, Service>& services() const { return services_; }
  // A job by its DNS name's labels (case-insensitive): "<job>.<entitlement>".
  const Service* find(std::string_view job, std::string_view entitlement) const;

 private:
  static std::string key(std::string_view job, std::string_view entitlement);
  uint64_t version_ = 0;
  std::map<std::string, Service> services_;
  std::unordered_map<std::string, std::string> by_name_;  // key() -> job
};

}  // namespace weft
