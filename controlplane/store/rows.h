// The stored form of a job's spec, its placement request and a task's ports: JSON rows,
// the same in sqlite and etcd (controlplane/store/state_store.h, etcd_store.h), read back
// as hostile input (a corrupt file or a forged etcd): errors name the field.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/records.h"

namespace weft::cp {

nlohmann::json job_spec_to_json(const JobSpec& s);
// Errors name the field ("count", "per_task.cpu_milli", ...).
Result<JobSpec> job_spec_from_json(const nlohmann::json& j);
// A job row as stored, by this or an older version (whose rows named the entitlement by
// id, and whose rules were looser: such a job is kept as it was, with an error logged).
Result<JobSpec> stored_job_spec(nlohmann::json j,
                                const std::function<std::string(EntitlementId)>& name_of);
// The allocator's request of a job, with the ports its tasks took from their machines'
// ranges (per index; Allocator::dynamic_ports) as "dynamic".
nlohmann::json request_to_json(const Request& r,
                               const std::vector<std::vector<uint16_t>>& dynamic = {});
Result<Request> request_from_json(const nlohmann::json& j);
// Its "dynamic" ports, per index (what is not a list of ports is left out).
std::vector<std::vector<uint16_t>> request_dynamic_ports(const nlohmann::json& j);
// A task's named ports as stored, and back (what is not a name and a port is left out).
nlohmann::json task_ports_json(const std::map<std::string, uint16_t>& ports);
std::map<std::string, uint16_t> task_ports_from(const nlohmann::json& j);

}  // namespace weft::cp
