// `top` (weftctl top, docs/operations.md): what running tasks use, through the control
// plane, by task, by job or by machine. The figures are the agents' (task.usage: each
// task's cgroup sampled every usage_interval), asked of every machine the query covers at
// once; a machine that does not answer within the timeout is named, not waited for.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/usage/agent_asks.h"

namespace weft::cp {

struct TopQuery {
  enum class Of { kJobs, kTasks, kMachines } of = Of::kJobs;
  std::string job, entitlement, machine;  // filters ("" = all)
};
// The one reader of top's params; errors name the field.
Result<TopQuery> parse_top_query(const nlohmann::json& p);

// The running tasks the query covers, by machine: what to ask.
std::map<MachineId, UsageRequest> top_asks(const TopQuery& q, const Allocator& alloc,
                                           const Scheduler& sched);

// top's answer from the agents' (tasks gone meanwhile are left out): rows by task, job
// or machine, largest CPU first, with what was reserved (or the machine's capacity).
nlohmann::json top_json(const TopQuery& q, const AgentAsks::Answer& a, const Allocator& alloc,
                        const Scheduler& sched);

}  // namespace weft::cp
