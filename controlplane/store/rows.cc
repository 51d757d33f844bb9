#include "controlplane/store/rows.h"

#include <limits>

#include "common/json_bounded.h"
#include "common/log.h"
#include "common/task_spec.h"

namespace weft::cp {

using json = nlohmann::json;

json job_spec_to_json(const JobSpec& s) {
  json j = weft::to_json(s);
  j["entitlement_id"] = s.entitlement_id;
  return j;
}

Result<JobSpec> job_spec_from_json(const json& j) {
  if (!j.is_object()) return field_error("job", "must be an object");
  json q = j;
  q.erase("entitlement_id");
  q.erase("progress");  // a stored row's (job_row_spec)
  TRY_ASSIGN(weft::JobSpec base, weft::parse_job_spec(q));
  JobSpec s;
  static_cast<weft::JobSpec&>(s) = std::move(base);
  TRY_ASSIGN(auto id, int_member(j, "entitlement_id", 0, 1, INT32_MAX));
  if (id == 0) return field_error("entitlement_id", "is required");
  s.entitlement_id = static_cast<EntitlementId>(id);
  return s;
}

Result<JobSpec> stored_job_spec(json j, const std::function<std::string(EntitlementId)>& name_of) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    return make_error("corrupt job row");
  // Rows written before the shared job schema named the entitlement by its id.
  if (j.contains("entitlement") && j["entitlement"].is_number_integer()) {
    j["entitlement_id"] = j["entitlement"];
    j["entitlement"] = name_of(j["entitlement"].get<EntitlementId>());
  }
  auto s = job_spec_from_json(j);
  if (s.ok()) return s;
  // A job stored under older, looser rules (a longer name, a task field the agent
  // never knew): kept as it was, so that the operator can still see, update or stop it.
  log_error(
      "a stored job does not pass today's job schema; it is kept as stored (update or "
      "stop it)",
      {{"JOB", j["name"].get<std::string>()}, {"ERROR", s.error().str()}});
  JobSpec legacy;
  legacy.name = j["name"].get<std::string>();
  legacy.entitlement = j.value("entitlement", std::string());
  TRY_ASSIGN(auto id, int_member(j, "entitlement_id", 1, 1, INT32_MAX));
  legacy.entitlement_id = static_cast<EntitlementId>(id);
  TRY_ASSIGN(auto count, int_member(j, "count", 1, 1, kMaxTasksPerJob));
  legacy.count = static_cast<int>(count);
  TRY_ASSIGN(auto mu, int_member(j, "max_unavailable", 1, 1, kMaxTasksPerJob));
  legacy.max_unavailable = static_cast<int>(mu);
  if (j.contains("per_task") && j["per_task"].is_object()) {
    TRY_ASSIGN(legacy.per_task.cpu_milli, int_member(j["per_task"], "cpu_milli", 0, 0, INT64_MAX));
    TRY_ASSIGN(legacy.per_task.mem_mb, int_member(j["per_task"], "mem_mb", 0, 0, INT64_MAX));
  }
  if (j.contains("machine_type") && j["machine_type"].is_string())
    legacy.machine_type = j["machine_type"].get<std::string>();
  if (j.value("placement", json()) == "pack") legacy.placement = weft::PlacementPolicy::kPack;
  if (j.contains("task") && j["task"].is_object()) legacy.task = j["task"];
  return legacy;
}

json request_to_json(const Request& r, const std::vector<std::vector<uint16_t>>& dynamic) {
  json j{{"job", r.job},
         {"generation", r.generation},
         {"entitlement", r.entitlement},
         {"tasks", r.tasks},
         {"cpu_milli", r.per_task.cpu_milli},
         {"mem_mb", r.per_task.mem_mb},
         {"machine_type", r.machine_type},
         {"dc", r.dc},
         {"spread", r.spread}};
  if (!r.fixed_ports.empty()) j["fixed_ports"] = r.fixed_ports;
  if (r.dynamic_ports) j["dynamic_ports"] = r.dynamic_ports;
  if (r.opportunistic) j["opportunistic"] = true;
  if (!dynamic.empty()) j["dynamic"] = dynamic;
  return j;
}

std::vector<std::vector<uint16_t>> request_dynamic_ports(const json& j) {
  std::vector<std::vector<uint16_t>> out;
  if (!j.is_object() || !j.contains("dynamic") || !j["dynamic"].is_array()) return out;
  for (const auto& row : j["dynamic"]) {
    out.emplace_back();
    if (!row.is_array()) continue;
    for (const auto& p : row)
      if (p.is_number_unsigned() && p.get<uint64_t>() >= 1 && p.get<uint64_t>() <= 65535)
        out.back().push_back(p.get<uint16_t>());
  }
  return out;
}

json task_ports_json(const std::map<std::string, uint16_t>& ports) {
  return ports.empty() ? json::object() : json(ports);
}

std::map<std::string, uint16_t> task_ports_from(const json& j) {
  std::map<std::string, uint16_t> out;
  if (!j.is_object()) return out;
  for (const auto& [name, p] : j.items())
    if (weft::valid_port_name(name) && p.is_number_unsigned() && p.get<uint64_t>() <= 65535)
      out[name] = p.get<uint16_t>();
  return out;
}

Result<Request> request_from_json(const json& j) {
  try {
    // A number that is not an integer in range (a stored row is read as hostile) would be
    // undefined behaviour to convert: refused like any other malformed field.
    auto integer = [](const json& v, const char* field, int64_t lo, int64_t hi) {
      if (!v.is_number_integer() ||
          (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi)
                                  : v.get<int64_t>() < lo || v.get<int64_t>() > hi))
        throw json::type_error::create(302, std::string(field) + " is not an integer in range", &v);
      return v.get<int64_t>();
    };
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
    Request r;
    r.job = j.at("job").get<std::string>();
    r.generation = static_cast<uint64_t>(integer(j.at("generation"), "generation", 0, kMax));
    r.entitlement =
        static_cast<EntitlementId>(integer(j.at("entitlement"), "entitlement", 0, kMaxInt));
    r.tasks = static_cast<int>(integer(j.at("tasks"), "tasks", 0, kMaxInt));
    r.per_task = {integer(j.at("cpu_milli"), "cpu_milli", 0, kMax),
                  integer(j.at("mem_mb"), "mem_mb", 0, kMax)};
    r.machine_type = j.at("machine_type").get<std::string>();
    r.dc = j.at("dc").get<std::string>();
    r.spread = j.at("spread").get<bool>();
    if (j.contains("fixed_ports")) {
      if (!j.at("fixed_ports").is_array()) throw json::type_error::create(302, "fixed_ports", &j);
      for (const auto& p : j.at("fixed_ports"))
        r.fixed_ports.push_back(static_cast<uint16_t>(integer(p, "fixed_ports", 0, 65535)));
    }
    if (j.contains("dynamic_ports"))
      r.dynamic_ports = static_cast<int>(integer(j.at("dynamic_ports"), "dynamic_ports", 0, 64));
    if (r.dynamic_ports < 0 || r.dynamic_ports > 64)
      return make_error("stored placement request: dynamic_ports out of range");
    if (j.contains("opportunistic")) r.opportunistic = j.at("opportunistic").get<bool>();
    return r;
  } catch (const json::exception& e) {
    return make_error(std::string("stored placement request: ") + e.what());
  }
}

}  // namespace weft::cp
