#include "common/services.h"

#include <arpa/inet.h>

#include <cctype>

#include "common/job_spec.h"
#include "common/strings.h"
#include "common/task_spec.h"

namespace weft {

using json = nlohmann::json;

bool valid_ip_address(const std::string& s) {
  unsigned char buf[16];
  return !s.empty() && s.size() < 64 &&
         (inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1);
}

json to_json(const Endpoint& e) {
  return {{"task", e.task},       {"index", e.index},     {"generation", e.generation},
          {"machine", e.machine}, {"address", e.address}, {"ports", json(e.ports)}};
}

json to_json(const Service& s) {
  json eps = json::array();
  for (const auto& e : s.endpoints) eps.push_back(to_json(e));
  return {{"entitlement", s.entitlement}, {"endpoints", std::move(eps)}};
}

namespace {

Result<Endpoint> parse_endpoint(const json& j, const std::string& field) {
  if (!j.is_object()) return field_error(field, "must be an object");
  Endpoint e;
  auto str = [&](const char* key, std::string* out, size_t max) -> Status {
    if (!j.contains(key) || !j[key].is_string() ||
        j[key].get_ref<const std::string&>().size() > max)
      return field_error(field + "." + key,
                         "must be a string of at most " + std::to_string(max) + " bytes");
    *out = j[key].get<std::string>();
    return {};
  };
  TRY(str("task", &e.task, 128));
  TRY(str("machine", &e.machine, 253));
  TRY(str("address", &e.address, 63));
  if (!valid_ip_address(e.address))
    return field_error(field + ".address", "must be an IPv4 or IPv6 address");
  if (!j.contains("index") || !j["index"].is_number_integer() || j["index"].get<int64_t>() < 0 ||
      j["index"].get<int64_t>() >= kMaxTasksPerJob)
    return field_error(field + ".index", "must be a task index");
  e.index = j["index"].get<int>();
  if (j.contains("generation")) {
    if (!j["generation"].is_number_unsigned())
      return field_error(field + ".generation", "must be a non-negative integer");
    e.generation = j["generation"].get<uint64_t>();
  }
  if (j.contains("ports")) {
    const json& ports = j["ports"];
    if (!ports.is_object() || ports.size() > kMaxTaskPorts)
      return field_error(field + ".ports",
                         "must be at most " + std::to_string(kMaxTaskPorts) + " names and ports");
    for (const auto& [name, port] : ports.items()) {
      if (!valid_port_name(name) || !port.is_number_unsigned() || port.get<uint64_t>() < 1 ||
          port.get<uint64_t>() > 65535)
        return field_error(field + ".ports." + name.substr(0, 16),
                           "must be a port's name and number");
      e.ports[name] = port.get<uint16_t>();
    }
  }
  return e;
}

}  // namespace

Result<Service> parse_service(const json& j, const std::string& field) {
  if (!j.is_object()) return field_error(field, "must be an object or null");
  Service s;
  if (!j.contains("entitlement") || !j["entitlement"].is_string() ||
      j["entitlement"].get_ref<const std::string&>().size() > 253)
    return field_error(field + ".entitlement", "must be an entitlement's name");
  s.entitlement = j["entitlement"].get<std::string>();
  if (!j.contains("endpoints") || !j["endpoints"].is_array() ||
      j["endpoints"].size() > kMaxEndpointsPerService)
    return field_error(field + ".endpoints", "must be a list of endpoints");
  const json& eps = j["endpoints"];
  s.endpoints.reserve(eps.size());
  for (size_t i = 0; i < eps.size(); ++i) {
    TRY_ASSIGN(Endpoint e, parse_endpoint(eps[i], field + ".endpoints[" + std::to_string(i) + "]"));
    s.endpoints.push_back(std::move(e));
  }
  return s;
}

Result<ServiceUpdate> parse_service_update(const json& j) {
  if (!j.is_object()) return field_error("params", "must be an object");
  ServiceUpdate u;
  if (!j.contains("version") || !j["version"].is_number_unsigned())
    return field_error("version", "must be a non-negative integer");
  u.version = j["version"].get<uint64_t>();
  if (j.contains("reset")) {
    if (!j["reset"].is_boolean()) return field_error("reset", "must be true or false");
    u.reset = j["reset"].get<bool>();
  }
  if (!j.contains("services") || !j["services"].is_object() ||
      j["services"].size() > kMaxServicesPerUpdate)
    return field_error("services", "must be an object of jobs");
  for (const auto& [job, v] : j["services"].items()) {
    if (!valid_job_name(job)) return field_error("services", "names no job: " + job.substr(0, 64));
    if (v.is_null()) {
      u.services[job] = std::nullopt;
      continue;
    }
    TRY_ASSIGN(Service s, parse_service(v, "services." + job));
    u.services[job] = std::move(s);
  }
  return u;
}

json to_json(const ServiceUpdate& u) {
  json services = json::object();
  for (const auto& [job, s] : u.services) services[job] = s ? to_json(*s) : json();
  return {{"version", u.version}, {"reset", u.reset}, {"services", std::move(services)}};
}

std::string ServiceCatalog::key(std::string_view job, std::string_view entitlement) {
  std::string k;
  k.reserve(job.size() + entitlement.size() + 1);
  for (char c : job) k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  k += '.';
  for (char c : entitlement) k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return k;
}

void ServiceCatalog::apply(const ServiceUpdate& u) {
  if (u.reset) {
    services_.clear();
    by_name_.clear();
  }
  for (const auto& [job, s] : u.services) {
    if (auto old = services_.find(job); old != services_.end()) {
      by_name_.erase(key(job, old->second.entitlement));
      services_.erase(old);
    }
    if (!s) continue;
    services_[job] = *s;
    by_name_[key(job, s->entitlement)] = job;
  }
  version_ = u.version;
}

void ServiceCatalog::forget(const std::string& job) {
  for (auto it = services_.begin(); it != services_.end();) {
    if (ascii_lower(it->first) != job) {
      ++it;
      continue;
    }
    by_name_.erase(key(it->first, it->second.entitlement));
    it = services_.erase(it);
  }
}

const Service* ServiceCatalog::find(std::string_view job, std::string_view entitlement) const {
  auto it = by_name_.find(key(job, entitlement));
  if (it == by_name_.end()) return nullptr;
  auto s = services_.find(it->second);
  return s == services_.end() ? nullptr : &s->second;
}

}  // namespace weft
