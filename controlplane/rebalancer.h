// The ReBalancer in the control plane (docs/rebalancer.md): the snapshot of one
// entitlement that the planner (rebalance.h) works on, from the allocator's machines and
// the scheduler's ready tasks, and the plan's moves named as operators know them.
// `rebalance.plan` shows what it would do now; carrying plans out (a loop, TaskControl
// moves, budgets) is the next step.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "controlplane/allocator.h"
#include "controlplane/rebalance.h"
#include "controlplane/scheduler.h"

namespace weft::cp {

struct RebalanceSnapshot {
  rebalance::Fleet fleet;
  std::vector<MachineId> machine_ids;  // fleet.machines[i] is machine_ids[i]
};

// The entitlement's machines (each with the capacity its listed tasks may use: what
// tasks not in the snapshot hold, starting or stopping ones, is taken off), its jobs,
// and their ready tasks.
RebalanceSnapshot rebalance_snapshot(const Allocator& alloc, const Scheduler& sched,
                                     EntitlementId e);

// rebalance.plan's answer for a snapshot: the scores before and after, and the moves
// (`exact`: the GLPK planner, consolidation only).
nlohmann::json rebalance_plan_json(const RebalanceSnapshot& s, const rebalance::Options& o,
                                   bool exact);

}  // namespace weft::cp
