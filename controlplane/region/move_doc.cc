#include "controlplane/region/move_doc.h"

#include <limits>
#include <map>
#include <set>

#include "common/clock.h"
#include "common/cp_link.h"
#include "common/job_spec.h"
#include "common/json_bounded.h"
#include "common/task_grants.h"
#include "controlplane/store/state_store.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {

// Bounds on what one document may hold: a shard's whole share of a region, no more.
constexpr size_t kMaxMachines = 100'000;
constexpr size_t kMaxJobs = 100'000;
constexpr size_t kMaxTasks = 2'000'000;
constexpr size_t kMaxString = 4096;

// Reads members of one object of the document, each error naming `path.key`.
class Fields {
 public:
  Fields(const json& j, std::string path) : j_(j), path_(std::move(path)) {}
  Status object() const {
    if (!j_.is_object())
      return field_error(path_.empty() ? "document" : path_, "must be an object");
    return {};
  }
  std::string name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  Result<std::string> str(const char* key, bool required = true) const {
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) return field_error(name(key), "is required");
      return std::string();
    }
    if (!it->is_string() || it->get_ref<const std::string&>().size() > kMaxString)
      return field_error(name(key), "must be a string");
    return it->get<std::string>();
  }
  Result<uint64_t> u64(const char* key, uint64_t max = std::numeric_limits<int64_t>::max()) const {
    auto it = j_.find(key);
    if (it == j_.end()) return field_error(name(key), "is required");
    // Written from a signed field it is a signed number; read from text, unsigned.
    bool whole = it->is_number_unsigned() || (it->is_number_integer() && it->get<int64_t>() >= 0);
    if (!whole || it->get<uint64_t>() > max)
      return field_error(name(key), "must be a number from 0 to " + std::to_string(max));
    return it->get<uint64_t>();
  }
  Result<bool> flag(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return false;
    if (!it->is_boolean()) return field_error(name(key), "must be true or false");
    return it->get<bool>();
  }
  Result<const json*> array(const char* key, size_t max) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_array()) return field_error(name(key), "must be a list");
    if (it->size() > max) return field_error(name(key), "has more than " + std::to_string(max));
    return &*it;
  }
  Result<std::set<std::string>> strings(const char* key) const {
    std::set<std::string> out;
    if (!j_.contains(key)) return out;
    TRY_ASSIGN(const json* a, array(key, kMaxTasksPerJob * 2));
    for (const json& v : *a) {
      if (!v.is_string() || v.get_ref<const std::string&>().size() > kMaxString)
        return field_error(name(key), "must be a list of strings");
      out.insert(v.get<std::string>());
    }
    return out;
  }

 private:
  const json& j_;
  std::string path_;
};

std::string at(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

Result<EntitlementSpec> read_entitlement(const json& j) {
  Fields f(j, "entitlement");
  TRY(f.object());
  EntitlementSpec e;
  TRY_ASSIGN(e.name, f.str("name"));
  if (e.name.empty()) return field_error("entitlement.name", "is required");
  TRY_ASSIGN(uint64_t quota, f.u64("quota", kMaxMachines));
  e.quota = quota;
  TRY_ASSIGN(e.profile, f.str("profile", false));
  TRY_ASSIGN(e.dc, f.str("dc", false));
  TRY_ASSIGN(auto owners, f.strings("owners"));
  e.owners.assign(owners.begin(), owners.end());
  TRY_ASSIGN(e.rebalance_paused, f.flag("rebalance_paused"));
  if (j.contains("grants")) {
    auto g = parse_task_grants(j["grants"], "");
    if (!g.ok()) return field_error("entitlement.grants", g.error().str());
    e.grants = std::move(g).value();
  }
  return e;
}

Result<MoveDoc::Machine> read_machine(const json& j, const std::string& path) {
  Fields f(j, path);
  TRY(f.object());
  MoveDoc::Machine m;
  MachineInfo& i = m.state.info;
  TRY_ASSIGN(i.id, f.str("name"));
  TRY(check_machine_name(f.name("name"), i.id, true));
  TRY_ASSIGN(i.dc, f.str("dc", false));
  TRY_ASSIGN(i.domain, f.str("domain", false));
  TRY_ASSIGN(i.type, f.str("type", false));
  TRY_ASSIGN(uint64_t cpu, f.u64("cpu_milli", 1ull << 40));
  TRY_ASSIGN(uint64_t mem, f.u64("mem_mb", 1ull << 40));
  i.capacity = {static_cast<int64_t>(cpu), static_cast<int64_t>(mem)};
  TRY_ASSIGN(uint64_t first, f.u64("port_first", 65535));
  TRY_ASSIGN(uint64_t last, f.u64("port_last", 65535));
  if (first > last) return field_error(f.name("port_first"), "must not be above port_last");
  i.port_first = static_cast<uint16_t>(first);
  i.port_last = static_cast<uint16_t>(last);
  TRY_ASSIGN(m.state.drained, f.flag("drained"));
  TRY_ASSIGN(m.state.applied_profile, f.str("applied_profile", false));
  TRY_ASSIGN(m.state.pinned, f.flag("pinned"));
  TRY_ASSIGN(m.epoch, f.u64("epoch"));
  TRY_ASSIGN(std::string verdict, f.str("verdict", false));
  if (!verdict.empty()) {
    if (verdict != "ok" && verdict != "degraded" && verdict != "failed" && verdict != "unknown")
      return field_error(f.name("verdict"), "must be ok, degraded, failed or unknown");
    m.verdict = verdict;
  }
  return m;
}

// A batch job's times travel as wall-clock µs (each shard's steady clock is its own).
int64_t wall_of_steady(uint64_t mono) {
  uint64_t now = now_monotonic_us();
  return static_cast<int64_t>(now_realtime_us()) -
         static_cast<int64_t>(now > mono ? now - mono : 0);
}
uint64_t steady_of_wall(int64_t wall) {
  int64_t ago = static_cast<int64_t>(now_realtime_us()) - wall;
  uint64_t now = now_monotonic_us();
  if (wall <= 0) return 0;
  return ago <= 0 ? now : static_cast<uint64_t>(ago) < now ? now - static_cast<uint64_t>(ago) : 1;
}

Result<MoveDoc::Job> read_job(const json& j, const std::string& path,
                              const std::set<std::string>& machines) {
  Fields f(j, path);
  TRY(f.object());
  MoveDoc::Job out;
  if (!j.contains("spec")) return field_error(f.name("spec"), "is required");
  auto spec = job_spec_from_json(j["spec"]);
  if (!spec.ok()) return field_error(f.name("spec"), spec.error().str());
  out.job.job.spec = std::move(spec).value();
  TRY_ASSIGN(out.job.job.generation, f.u64("generation"));
  if (out.job.job.generation < 1) return field_error(f.name("generation"), "must be at least 1");
  TRY_ASSIGN(out.job.job.stopping, f.flag("stopping"));
  if (j.contains("progress"))
    out.job.job.progress = progress_from_json(j["progress"], steady_of_wall);
  TRY_ASSIGN(out.job.granted, f.strings("granted"));
  TRY_ASSIGN(out.job.moves, f.strings("moves"));
  TRY_ASSIGN(out.job.fallback, f.flag("fallback"));
  if (j.contains("in_progress")) {
    TRY_ASSIGN(const json* ops, f.array("in_progress", kMaxTasksPerJob));
    for (size_t i = 0; i < ops->size(); ++i) {
      Fields o((*ops)[i], at(f.name("in_progress"), i));
      TRY(o.object());
      TRY_ASSIGN(uint64_t index, o.u64("index", kMaxTasksPerJob));
      TRY_ASSIGN(std::string op, o.str("op"));
      out.job.in_progress[static_cast<int>(index)] = op;
    }
  }
  if (j.contains("request") && !j["request"].is_null()) {
    auto r = request_from_json(j["request"]);
    if (!r.ok()) return field_error(f.name("request"), r.error().str());
    if (r->job != out.job.job.spec.name || r->tasks < 0 || r->tasks > kMaxTasksPerJob)
      return field_error(f.name("request"), "is not this job's");
    out.request = std::move(r).value();
    out.dynamic_ports = request_dynamic_ports(j["request"]);
    TRY_ASSIGN(const json* p, f.array("placement", kMaxTasksPerJob));
    for (size_t i = 0; i < p->size(); ++i) {
      const json& v = (*p)[i];
      if (!v.is_string() || !machines.count(v.get<std::string>()))
        return field_error(at(f.name("placement"), i), "must name a machine of the document");
      out.placement.push_back(v.get<std::string>());
    }
    if (out.placement.size() != static_cast<size_t>(out.request->tasks))
      return field_error(f.name("placement"), "must name one machine per task");
  }
  return out;
}

Result<MoveDoc::Task> read_task(const json& j, const std::string& path,
                                const std::set<std::string>& machines,
                                const std::map<std::string, int>& jobs) {
  Fields f(j, path);
  TRY(f.object());
  MoveDoc::Task t;
  TaskRecord& r = t.record;
  TRY_ASSIGN(r.id, f.str("id"));
  TRY_ASSIGN(r.job, f.str("job"));
  auto job = jobs.find(r.job);
  if (job == jobs.end()) return field_error(f.name("job"), "must name a job of the document");
  TRY_ASSIGN(uint64_t index, f.u64("index", kMaxTasksPerJob - 1));
  r.index = static_cast<int>(index);
  if (r.id.rfind(r.job + ".", 0) != 0 || r.id.size() == r.job.size() + 1)
    return field_error(f.name("id"), "is not a task of job " + r.job);
  TRY_ASSIGN(r.generation, f.u64("generation"));
  TRY_ASSIGN(t.machine, f.str("machine"));
  if (!machines.count(t.machine))
    return field_error(f.name("machine"), "must name a machine of the document");
  TRY_ASSIGN(std::string state, f.str("state"));
  auto s = parse_task_state(state);
  if (!s) return field_error(f.name("state"), "is not a task state");
  r.state = *s;
  TRY_ASSIGN(t.age_us, f.u64("age_us"));
  TRY_ASSIGN(r.message, f.str("message", false));
  TRY_ASSIGN(r.held, f.flag("held"));
  TRY_ASSIGN(r.ready, f.flag("ready"));
  if (j.contains("ports")) {
    if (!j["ports"].is_object()) return field_error(f.name("ports"), "must be an object");
    r.ports = task_ports_from(j["ports"]);
  }
  return t;
}

}  // namespace

json move_doc_to_json(const MoveDoc& d) {
  json out;
  // The entitlement as the store keeps it: one writer of its fields.
  out["entitlement"] = StateStore::entitlement_row(d.entitlement);
  json machines = json::array();
  for (const auto& m : d.machines) {
    const MachineInfo& i = m.state.info;
    machines.push_back({{"name", i.id},
                        {"dc", i.dc},
                        {"domain", i.domain},
                        {"type", i.type},
                        {"cpu_milli", i.capacity.cpu_milli},
                        {"mem_mb", i.capacity.mem_mb},
                        {"port_first", i.port_first},
                        {"port_last", i.port_last},
                        {"drained", m.state.drained},
                        {"applied_profile", m.state.applied_profile},
                        {"pinned", m.state.pinned},
                        {"epoch", m.epoch},
                        {"verdict", m.verdict}});
  }
  out["machines"] = std::move(machines);
  json jobs = json::array();
  for (const auto& j : d.jobs) {
    json row{{"spec", job_spec_to_json(j.job.job.spec)},
             {"generation", j.job.job.generation},
             {"stopping", j.job.job.stopping},
             {"granted", j.job.granted},
             {"moves", j.job.moves},
             {"fallback", j.job.fallback}};
    if (!(j.job.job.progress == JobProgress{}))
      row["progress"] = progress_json(j.job.job.progress, wall_of_steady);
    json ops = json::array();
    for (const auto& [index, op] : j.job.in_progress) ops.push_back({{"index", index}, {"op", op}});
    row["in_progress"] = std::move(ops);
    if (j.request) {
      row["request"] = request_to_json(*j.request, j.dynamic_ports);
      row["placement"] = j.placement;
    }
    jobs.push_back(std::move(row));
  }
  out["jobs"] = std::move(jobs);
  json tasks = json::array();
  for (const auto& t : d.tasks) {
    const TaskRecord& r = t.record;
    json row{{"id", r.id},           {"job", r.job},
             {"index", r.index},     {"generation", r.generation},
             {"machine", t.machine}, {"state", task_state_name(r.state)},
             {"age_us", t.age_us},   {"message", r.message},
             {"held", r.held},       {"ready", r.ready}};
    if (!r.ports.empty()) row["ports"] = task_ports_json(r.ports);
    tasks.push_back(std::move(row));
  }
  out["tasks"] = std::move(tasks);
  if (d.profile_roll) out["profile_roll"] = d.profile_roll->to_json();
  out["task_seq"] = d.task_seq;
  return out;
}

Result<MoveDoc> parse_move_doc(const json& j) {
  Fields f(j, "");
  TRY(f.object());
  MoveDoc d;
  if (!j.contains("entitlement")) return field_error("entitlement", "is required");
  TRY_ASSIGN(d.entitlement, read_entitlement(j["entitlement"]));
  std::set<std::string> machines;
  TRY_ASSIGN(const json* ms, f.array("machines", kMaxMachines));
  for (size_t i = 0; i < ms->size(); ++i) {
    TRY_ASSIGN(auto m, read_machine((*ms)[i], at("machines", i)));
    if (!machines.insert(m.state.info.id).second)
      return field_error(at("machines", i) + ".name", "names a machine twice");
    d.machines.push_back(std::move(m));
  }
  std::map<std::string, int> jobs;
  TRY_ASSIGN(const json* js, f.array("jobs", kMaxJobs));
  for (size_t i = 0; i < js->size(); ++i) {
    TRY_ASSIGN(auto job, read_job((*js)[i], at("jobs", i), machines));
    const JobSpec& s = job.job.job.spec;
    if (s.entitlement != d.entitlement.name)
      return field_error(at("jobs", i) + ".spec.entitlement", "must be " + d.entitlement.name);
    if (!jobs.emplace(s.name, s.count).second)
      return field_error(at("jobs", i) + ".spec.name", "names a job twice");
    d.jobs.push_back(std::move(job));
  }
  std::set<std::string> ids;
  TRY_ASSIGN(const json* ts, f.array("tasks", kMaxTasks));
  for (size_t i = 0; i < ts->size(); ++i) {
    TRY_ASSIGN(auto t, read_task((*ts)[i], at("tasks", i), machines, jobs));
    if (!ids.insert(t.record.id).second)
      return field_error(at("tasks", i) + ".id", "names a task twice");
    d.tasks.push_back(std::move(t));
  }
  if (j.contains("profile_roll") && !j["profile_roll"].is_null()) {
    TRY_ASSIGN(auto roll, ProfileRolls::Moved::from_json(j["profile_roll"], "profile_roll"));
    for (auto [key, names] :
         {std::pair{"waiting", &roll.waiting}, std::pair{"applying", &roll.applying}})
      for (size_t i = 0; i < names->size(); ++i)
        if (!machines.count((*names)[i]))
          return field_error(at(std::string("profile_roll.") + key, i),
                             "must name a machine of the document");
    d.profile_roll = std::move(roll);
  }
  TRY_ASSIGN(d.task_seq, f.u64("task_seq"));
  return d;
}

}  // namespace weft::cp
