// weft-controlplane's JSON-RPC API (docs/protocol.md): one named handler per method,
// listed in one table with whether it is an operator call (Unix socket, weft group).
// The handlers translate between the protocol and the modules (broker, scheduler,
// allocator); what they change is written before they answer.
#include <set>

#include "common/log.h"
#include "controlplane/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

void Manager::register_methods() {
  // Guarded: changes the cluster, operators only (check_operator).
  static const rpc::Method<Manager> kMethods[] = {
      {"machine.register", &Manager::api_machine_register},
      {"machine.heartbeat", &Manager::api_machine_heartbeat},
      {"machine.report", &Manager::api_machine_report},
      {"health.report", &Manager::api_health_report},
      {"profile.report", &Manager::api_profile_report},
      {"entitlement.create", &Manager::api_entitlement_create, true},
      {"entitlement.ls", &Manager::api_entitlement_ls},
      {"entitlement.show", &Manager::api_entitlement_show},
      {"job.create", &Manager::api_job_create, true},
      {"job.scale", &Manager::api_job_scale, true},
      {"job.update", &Manager::api_job_update, true},
      {"job.stop", &Manager::api_job_stop, true},
      {"job.ls", &Manager::api_job_ls},
      {"job.show", &Manager::api_job_show},
      {"task.ls", &Manager::api_task_ls},
      {"machine.ls", &Manager::api_machine_ls},
      {"machine.show", &Manager::api_machine_show},
      {"machine.drain", &Manager::api_machine_drain, true},
  };
  rpc::add_methods(methods_, this, kMethods,
                   [this](const rpc::CallContext& c) { return check_operator(c); });
}

Result<json> Manager::api_machine_register(const json& p, const CallContext& c) {
  if (!p.is_object()) return field_error("params", "must be an object");
  MachineInfo info;
  for (auto [key, out] : {std::pair{"machine", &info.id},
                          {"dc", &info.dc},
                          {"domain", &info.domain},
                          {"type", &info.type}}) {
    if (p.contains(key) && !p[key].is_string()) return field_error(key, "must be a string");
    if (p.contains(key)) *out = p[key].get<std::string>();
  }
  for (auto [key, out] :
       {std::pair{"cpu_milli", &info.capacity.cpu_milli}, {"mem_mb", &info.capacity.mem_mb}}) {
    if (!p.contains(key) || !p[key].is_number_integer())
      return field_error(key, "must be an integer");
    *out = p[key].get<int64_t>();
  }
  if (p.contains("controllers") && !p["controllers"].is_array())
    return field_error("controllers", "must be a list of cgroup controller names");
  TRY(check_machine_identity(c.peer, info.id));
  TRY_ASSIGN(MachineId m, broker_.register_machine(info, now_us()));
  track_session(sessions_, m, c.session);
  if (p.contains("controllers")) controllers_[m] = p["controllers"];
  TRY(persist({}, {m}));
  return json{{"machine", info.id},
              {"profile", broker_.desired_profile(m)},
              {"heartbeat_interval_ms", cfg_.broker.heartbeat_interval_us / 1000}};
}

Result<json> Manager::api_machine_heartbeat(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  TRY(broker_.heartbeat(p["machine"].get<std::string>(), now_us()));
  return json{{"profile", broker_.desired_profile(m)}};
}

Result<json> Manager::api_machine_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  // The machine is alive whatever its report says: a report refused below (a state this
  // version does not know, from a newer agent) must not get its tasks declared lost.
  (void)broker_.heartbeat(p["machine"].get<std::string>(), now_us());
  if (!p.contains("tasks") || !p["tasks"].is_object())
    return field_error("tasks", "must be an object of task id -> state");
  std::map<std::string, TaskState> tasks;
  for (const auto& [id, st] : p["tasks"].items()) {
    auto state = st.is_string() ? weft::parse_task_state(st.get<std::string>()) : std::nullopt;
    if (!state) return field_error("tasks." + id, "must be a task state (common/task_state.h)");
    tasks[id] = *state;
  }
  std::vector<std::string> forget;
  auto cmds = sched_.report(m, tasks, now_us(), &forget);
  auto changed = sched_.take_reported_changes();
  if (!cmds.empty()) TRY(persist_commands(cmds));
  if (!changed.empty()) TRY(persist(changed, {m}));
  send(cmds);
  // Ended tasks whose end is now durable here: the machine stops reporting them, so a
  // report stays the size of what the machine runs.
  return json{{"commands", cmds.size()}, {"forget", forget}};
}

Result<json> Manager::api_health_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  if (!p.contains("verdict") || !p["verdict"].is_string())
    return field_error("verdict", "must be ok, degraded, failed or unknown");
  std::string before = broker_.state_of(m);
  TRY(broker_.health(p["machine"].get<std::string>(), p["verdict"].get<std::string>(), now_us()));
  health_problems_[m] = p.value("problems", json::array());
  // A machine that failed has its tasks replaced now, and one that became healthy
  // takes what waited for it, not at the next tick; an unchanged verdict (every
  // heartbeat) costs nothing more.
  if (broker_.state_of(m) != before) tick();
  return json::object();
}

Result<json> Manager::api_profile_report(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, own_machine(p, c));
  if (!p.contains("profile") || !p["profile"].is_string())
    return field_error("profile", "must be the applied profile's name");
  if (p.contains("state") && !p["state"].is_string())
    return field_error("state", "must be the last switch's outcome");
  bool changed = broker_.persisted(m).applied_profile != p["profile"].get<std::string>();
  TRY(broker_.profile_applied(p["machine"].get<std::string>(), p["profile"].get<std::string>()));
  track_session(sidekick_sessions_, m, c.session);
  profile_state_[m] = p.value("state", "");
  pushed_profile_.erase(m);  // the reply carries the desired profile
  if (changed) {             // a report every heartbeat writes and schedules nothing
    TRY(persist({}, {m}));
    tick();
  }
  return json{{"desired", broker_.desired_profile(m)}};
}

Result<json> Manager::api_entitlement_create(const json& p, const CallContext&) {
  EntitlementSpec e;
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  e.name = p["name"].get<std::string>();
  if (!p.contains("quota") || !p["quota"].is_number_unsigned())
    return field_error("quota", "must be a number of machines");
  e.quota = p["quota"].get<size_t>();
  for (auto [key, out] : {std::pair{"profile", &e.profile}, {"dc", &e.dc}}) {
    if (p.contains(key) && !p[key].is_string()) return field_error(key, "must be a string");
    if (p.contains(key)) *out = p[key].get<std::string>();
  }
  TRY_ASSIGN(EntitlementId id, broker_.create_entitlement(e));
  if (auto s = persist({}, {}); !s.ok()) {
    broker_.forget_entitlement(id);  // not durable: not created
    return std::move(s).error();
  }
  return json{{"id", id}, {"name", e.name}};
}

Result<json> Manager::api_entitlement_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& [id, e] : broker_.entitlements())
    arr.push_back({{"id", id},
                   {"name", e.name},
                   {"quota", e.quota},
                   {"profile", e.profile},
                   {"dc", e.dc},
                   {"machines", alloc_.pool_size(id)}});
  return json{{"entitlements", arr}};
}

Result<json> Manager::api_entitlement_show(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  auto id = broker_.entitlement(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  const auto& e = broker_.entitlement_spec(*id);
  json machines = json::array(), jobs = json::array();
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == *id) machines.push_back(machine_json(m));
  for (const auto& j : sched_.persisted_jobs())
    if (j.spec.entitlement_id == *id) jobs.push_back(j.spec.name);
  return json{{"id", *id},  {"name", e.name},       {"quota", e.quota}, {"profile", e.profile},
              {"dc", e.dc}, {"machines", machines}, {"jobs", jobs}};
}

Result<json> Manager::api_job_create(const json& p, const CallContext&) {
  TRY_ASSIGN(JobSpec spec, job_from_params(p));
  TRY_ASSIGN(auto cmds, sched_.create(spec, now_us()));
  auto placed = alloc_.placement(spec.name);
  std::set<MachineId> ms(placed.begin(), placed.end());
  if (auto s = persist({spec.name}, ms); !s.ok()) {
    sched_.abandon(spec.name);  // not durable: not created, nothing was sent
    (void)sched_.take_pool_changes();
    return std::move(s).error();
  }
  send(cmds);
  return json{{"job", spec.name}, {"tasks", cmds.size()}};
}

Result<json> Manager::job_op(const std::string& op, const json& p) {
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  std::string name = p["name"].get<std::string>();
  Result<std::vector<Command>> cmds = make_error("unknown operation");
  if (op == "scale") {
    const json& count = p.contains("count") ? p["count"] : json();
    if (!count.is_number_integer() || count.get<int64_t>() < 1 ||
        count.get<int64_t>() > kMaxTasksPerJob ||
        (count.is_number_unsigned() && count.get<uint64_t>() > kMaxTasksPerJob))
      return field_error("count",
                         "must be an integer from 1 to " + std::to_string(kMaxTasksPerJob));
    cmds = sched_.scale(name, static_cast<int>(count.get<int64_t>()), now_us());
  } else if (op == "update") {
    TRY_ASSIGN(JobSpec spec, job_from_params(p));
    cmds = sched_.update(spec, now_us());
  } else {
    cmds = sched_.stop(name, now_us());
  }
  if (!cmds.ok()) return cmds.error();
  auto placed = alloc_.placement(name);
  std::set<MachineId> ms(placed.begin(), placed.end());
  TRY(persist({name}, ms));
  send(*cmds);
  return json{{"job", name}, {"commands", cmds->size()}};
}

Result<json> Manager::api_job_scale(const json& p, const CallContext&) {
  return job_op("scale", p);
}

Result<json> Manager::api_job_update(const json& p, const CallContext&) {
  return job_op("update", p);
}

Result<json> Manager::api_job_stop(const json& p, const CallContext&) {
  return job_op("stop", p);
}

Result<json> Manager::api_job_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& j : sched_.persisted_jobs()) {
    int running = 0;
    for (const auto& t : sched_.tasks_of(j.spec.name)) running += t.state == TaskState::kRunning;
    arr.push_back({{"name", j.spec.name},
                   {"count", j.spec.count},
                   {"running", running},
                   {"generation", j.generation},
                   {"entitlement", j.spec.entitlement},
                   {"stopping", j.stopping}});
  }
  return json{{"jobs", arr}};
}

Result<json> Manager::api_job_show(const json& p, const CallContext&) {
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  auto spec = sched_.job(p["name"].get<std::string>());
  if (!spec) return field_error("name", "no such job").with_code(rpc::kNotFound);
  json tasks = json::array();
  for (const auto& t : sched_.tasks_of(spec->name)) tasks.push_back(task_json(t, alloc_));
  return json{{"spec", weft::to_json(*spec)},
              {"entitlement", spec->entitlement},
              {"generation", sched_.generation(spec->name)},
              {"tasks", tasks}};
}

Result<json> Manager::api_task_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& [id, t] : sched_.tasks()) arr.push_back(task_json(t, alloc_));
  return json{{"tasks", arr}};
}

Result<json> Manager::api_machine_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (MachineId m = 0; m < alloc_.machine_count(); ++m) arr.push_back(machine_json(m));
  return json{{"machines", arr}};
}

Result<json> Manager::api_machine_show(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  json j = machine_json(m);
  json tasks = json::array();
  for (const auto& [id, t] : sched_.tasks())
    if (t.machine == m) tasks.push_back(task_json(t, alloc_));
  j["task_list"] = tasks;
  json events = json::array();
  for (const auto& e : broker_.events())
    if (e.machine == j["machine"])
      events.push_back({{"at_us", e.at_us}, {"kind", e.kind}, {"detail", e.detail}});
  j["events"] = events;
  return j;
}

Result<json> Manager::api_machine_drain(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  if (p.contains("drained") && !p["drained"].is_boolean())
    return field_error("drained", "must be true or false");
  bool drained = p.value("drained", true);
  TRY(broker_.drain(p["machine"].get<std::string>(), drained, now_us()));
  std::vector<Command> cmds;
  if (drained) cmds = sched_.machine_drain(m, now_us());
  std::set<std::string> jobs;
  for (const auto& [id, t] : sched_.tasks())
    if (t.machine == m) jobs.insert(t.job);
  for (const auto& cmd : cmds)
    if (auto it = sched_.tasks().find(cmd.task_id); it != sched_.tasks().end())
      jobs.insert(it->second.job);
  TRY(persist(jobs, {m}));
  send(cmds);
  tick();
  return json{{"machine", p["machine"]}, {"drained", drained}};
}

}  // namespace weft::cp
