#include "controlplane/rebalancer.h"

#include <chrono>
#include <map>

namespace weft::cp {

using json = nlohmann::json;

RebalanceSnapshot rebalance_snapshot(const Allocator& alloc, const Scheduler& sched,
                                     EntitlementId e) {
  RebalanceSnapshot s;
  std::map<MachineId, uint32_t> index;
  std::map<std::string, uint32_t> domains;
  for (MachineId m = 0; m < alloc.machine_count(); ++m) {
    if (alloc.entitlement_of(m) != e) continue;
    const MachineSpec& spec = alloc.spec(m);
    uint32_t d = domains.emplace(spec.domain, static_cast<uint32_t>(domains.size())).first->second;
    index[m] = static_cast<uint32_t>(s.fleet.machines.size());
    s.machine_ids.push_back(m);
    s.fleet.machines.push_back(rebalance::Machine{spec.name, d, spec.capacity.cpu_milli,
                                                  spec.capacity.mem_mb, alloc.usable(m)});
  }
  std::vector<int64_t> listed_cpu(s.fleet.machines.size()), listed_mem(s.fleet.machines.size());
  for (const auto& pj : sched.persisted_jobs()) {
    const JobSpec& spec = pj.spec;
    if (spec.entitlement_id != e || pj.stopping) continue;
    uint32_t j = static_cast<uint32_t>(s.fleet.jobs.size());
    s.fleet.jobs.push_back(rebalance::Job{spec.name, spec.max_unavailable,
                                          spec.placement == weft::PlacementPolicy::kSpread,
                                          !spec.rebalance});
    for (const TaskRecord* t : sched.task_refs_of(spec.name)) {
      if (!available(*t) || t->state != TaskState::kRunning) continue;
      auto it = index.find(t->machine);
      if (it == index.end()) continue;
      s.fleet.tasks.push_back(
          rebalance::Task{t->id, j, it->second, spec.per_task.cpu_milli, spec.per_task.mem_mb});
      listed_cpu[it->second] += spec.per_task.cpu_milli;
      listed_mem[it->second] += spec.per_task.mem_mb;
    }
  }
  // What the snapshot's tasks do not account for (tasks starting, stopping, draining)
  // stays held: the machine's capacity for the plan is less by that.
  for (size_t i = 0; i < s.fleet.machines.size(); ++i) {
    MachineId m = s.machine_ids[i];
    const MachineSpec& spec = alloc.spec(m);
    Resources free = alloc.free(m);
    int64_t other_cpu = spec.capacity.cpu_milli - free.cpu_milli - listed_cpu[i];
    int64_t other_mem = spec.capacity.mem_mb - free.mem_mb - listed_mem[i];
    s.fleet.machines[i].cpu_milli -= std::max<int64_t>(other_cpu, 0);
    s.fleet.machines[i].mem_mb -= std::max<int64_t>(other_mem, 0);
  }
  return s;
}

namespace {
json score_json(const rebalance::Score& s) {
  return json{{"spread_violations", s.spread_violations},
              {"machines_used", s.machines_used},
              {"machines_empty", s.machines_empty},
              {"cpu_stddev", s.cpu_stddev}};
}
}  // namespace

json rebalance_plan_json(const RebalanceSnapshot& s, const rebalance::Options& o, bool exact) {
  auto t0 = std::chrono::steady_clock::now();
  std::string status;
  auto plan =
      exact ? rebalance::plan_exact(s.fleet, o, &status) : rebalance::plan_local(s.fleet, o);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  rebalance::Fleet after = s.fleet;
  rebalance::apply_moves(after, plan);
  json moves = json::array();
  for (const auto& m : plan) {
    const auto& t = s.fleet.tasks[m.task];
    moves.push_back({{"task", t.id},
                     {"job", s.fleet.jobs[t.job].name},
                     {"from", s.fleet.machines[m.from].name},
                     {"to", s.fleet.machines[m.to].name},
                     {"aim", rebalance::aim_name(m.aim)}});
  }
  json out{{"planner", exact ? "exact" : "local"},
           {"machines", s.fleet.machines.size()},
           {"jobs", s.fleet.jobs.size()},
           {"tasks", s.fleet.tasks.size()},
           {"before", score_json(rebalance::score(s.fleet))},
           {"after", score_json(rebalance::score(after))},
           {"moves", moves},
           {"planning_ms", ms}};
  if (exact) out["solver"] = status;
  return out;
}

}  // namespace weft::cp
