#include "controlplane/usage/top.h"

#include <algorithm>
#include <vector>

namespace weft::cp {

using json = nlohmann::json;

Result<TopQuery> parse_top_query(const json& p) {
  if (!p.is_object()) return field_error("params", "must be an object");
  TopQuery q;
  if (p.contains("of")) {
    if (!p["of"].is_string()) return field_error("of", "must be jobs, tasks or machines");
    const std::string of = p["of"].get<std::string>();
    if (of == "jobs")
      q.of = TopQuery::Of::kJobs;
    else if (of == "tasks")
      q.of = TopQuery::Of::kTasks;
    else if (of == "machines")
      q.of = TopQuery::Of::kMachines;
    else
      return field_error("of", "must be jobs, tasks or machines, not \"" + of.substr(0, 64) + "\"");
  }
  for (auto [key, out] :
       {std::pair{"job", &q.job}, {"entitlement", &q.entitlement}, {"machine", &q.machine}}) {
    if (!p.contains(key)) continue;
    if (!p[key].is_string() || p[key].get<std::string>().size() > 256)
      return field_error(key, "must be a name");
    *out = p[key].get<std::string>();
  }
  return q;
}

namespace {

bool covered(const TopQuery& q, const TaskRecord& t, const Allocator& alloc,
             const Scheduler& sched) {
  if (t.state != TaskState::kRunning && t.state != TaskState::kDraining) return false;
  if (!q.job.empty() && t.job != q.job) return false;
  if (!q.machine.empty() && alloc.spec(t.machine).name != q.machine) return false;
  if (!q.entitlement.empty()) {
    auto spec = sched.job(t.job);
    if (!spec || spec->entitlement != q.entitlement) return false;
  }
  return true;
}

struct Sum {
  int64_t tasks = 0, measured = 0;
  uint64_t cpu_milli = 0, mem_bytes = 0, io_read_bps = 0, io_write_bps = 0;
  void add(const TaskUsage* u) {
    ++tasks;
    if (!u) return;
    ++measured;
    cpu_milli += u->cpu_milli;
    mem_bytes += u->mem_bytes;
    io_read_bps += u->io_read_bps;
    io_write_bps += u->io_write_bps;
  }
  void to(json& row) const {
    row["tasks"] = tasks;
    row["measured"] = measured;
    row["cpu_milli"] = cpu_milli;
    row["mem_bytes"] = mem_bytes;
    row["io_read_bps"] = io_read_bps;
    row["io_write_bps"] = io_write_bps;
  }
};

}  // namespace

std::map<MachineId, UsageRequest> top_asks(const TopQuery& q, const Allocator& alloc,
                                           const Scheduler& sched) {
  std::map<MachineId, UsageRequest> asks;
  for (const auto& [id, t] : sched.tasks())
    if (covered(q, t, alloc, sched)) asks[t.machine].tasks.push_back(id);
  return asks;
}

json top_json(const TopQuery& q, const AgentAsks::Answer& a, const Allocator& alloc,
              const Scheduler& sched) {
  json rows = json::array();
  std::map<std::string, Sum> by_job;
  std::map<MachineId, Sum> by_machine;
  for (const auto& [id, t] : sched.tasks()) {
    if (!covered(q, t, alloc, sched)) continue;
    auto it = a.tasks.find(id);
    const TaskUsage* u = it == a.tasks.end() ? nullptr : &it->second;
    by_job[t.job].add(u);
    by_machine[t.machine].add(u);
    if (q.of != TopQuery::Of::kTasks) continue;
    auto spec = sched.job(t.job);
    json row{{"task", id},
             {"job", t.job},
             {"machine", alloc.spec(t.machine).name},
             {"state", task_state_name(t.state)},
             {"cpu_request_milli", spec ? spec->per_task.cpu_milli : 0},
             {"mem_request_mb", spec ? spec->per_task.mem_mb : 0}};
    if (u) {
      row["cpu_milli"] = u->cpu_milli;
      row["mem_bytes"] = u->mem_bytes;
      row["io_read_bps"] = u->io_read_bps;
      row["io_write_bps"] = u->io_write_bps;
    }
    rows.push_back(std::move(row));
  }
  if (q.of == TopQuery::Of::kJobs) {
    for (const auto& [job, sum] : by_job) {
      auto spec = sched.job(job);
      json row{{"job", job},
               {"entitlement", spec ? spec->entitlement : ""},
               {"cpu_request_milli", spec ? spec->per_task.cpu_milli * sum.tasks : 0},
               {"mem_request_mb", spec ? spec->per_task.mem_mb * sum.tasks : 0}};
      sum.to(row);
      rows.push_back(std::move(row));
    }
  } else if (q.of == TopQuery::Of::kMachines) {
    for (const auto& [m, sum] : by_machine) {
      const MachineSpec& spec = alloc.spec(m);
      json row{{"machine", spec.name},
               {"cpu_capacity_milli", spec.capacity.cpu_milli},
               {"mem_capacity_mb", spec.capacity.mem_mb}};
      sum.to(row);
      rows.push_back(std::move(row));
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const json& x, const json& y) {
    return x.value("cpu_milli", uint64_t{0}) > y.value("cpu_milli", uint64_t{0});
  });
  json silent = json::array();
  for (MachineId m : a.silent)
    if (m < alloc.machine_count()) silent.push_back(alloc.spec(m).name);
  const char* of = q.of == TopQuery::Of::kJobs    ? "jobs"
                   : q.of == TopQuery::Of::kTasks ? "tasks"
                                                  : "machines";
  return json{{"of", of}, {"interval_ms", a.interval_ms}, {"rows", rows}, {"silent", silent}};
}

}  // namespace weft::cp
