#include "common/job_spec.h"

#include <algorithm>
#include <cctype>
#include <climits>

#include "common/cron.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/prometheus_text.h"
#include "common/rpc/endpoint.h"
#include "common/task_spec.h"
#include "common/units.h"

namespace weft {

using json = nlohmann::json;

namespace {

Result<std::string> str_field(const json& j, const char* key, const std::string& prefix = "") {
  if (!j.contains(key) || j[key].is_null()) return std::string();
  if (!j[key].is_string()) return field_error(prefix + key, "must be a string");
  return j[key].get<std::string>();
}

}  // namespace

const char* placement_name(PlacementPolicy p) {
  return p == PlacementPolicy::kPack ? "pack" : "spread";
}

bool valid_job_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxJobNameLength) return false;
  if (!std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  return true;
}

bool valid_entitlement_name(std::string_view s) {
  if (s.empty() || s.size() > 64 || !std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

std::string make_task_id(const std::string& job, int index, uint64_t seq) {
  return job + "." + std::to_string(index) + "." + std::to_string(seq);
}

json task_run_params(const JobSpec& s, const std::string& task_id,
                     const std::map<std::string, uint16_t>& ports) {
  json t = s.task.is_object() ? s.task : json::object();
  if (!ports.empty())
    t["ports"] = ports;
  else if (!s.ports.empty())
    t["ports"] = s.ports;
  t["name"] = task_id;  // the agent refuses a second live task of that name: idempotent
  t["owner"] = "controlplane";
  t["entitlement"] = s.entitlement;
  if (s.at_most_one()) t["at_most_one"] = true;
  return t;
}

std::string task_run_body(const JobSpec& s) {
  json t = s.task.is_object() ? s.task : json::object();
  t.erase("name");
  t.erase("ports");
  t["owner"] = "controlplane";
  t["entitlement"] = s.entitlement;
  if (s.at_most_one()) t["at_most_one"] = true;
  return t.dump();
}

std::string task_run_text(std::string_view body, const std::string& task_id,
                          const std::map<std::string, uint16_t>& ports, std::string_view extra) {
  // body is a serialised object, never "{}" (it always has "owner"): its closing brace
  // gives way to the task's own keys.
  std::string out;
  out.reserve(body.size() + task_id.size() + extra.size() + 16 + 24 * ports.size());
  out.append(body.substr(0, body.size() - 1));
  out += ",\"name\":";
  out += json(task_id).dump();
  if (!ports.empty()) {
    out += ",\"ports\":";
    out += json(ports).dump();
  }
  out += extra;
  out += '}';
  return out;
}

const char* autoscale_metric_name(AutoscaleMetric m) {
  return m == AutoscaleMetric::kMemory ? "memory" : m == AutoscaleMetric::kApp ? "app" : "cpu";
}

namespace {
// A number member in [lo, hi], or `def` when absent.
Result<double> number_member(const json& j, const char* key, double def, double lo, double hi,
                             const std::string& prefix) {
  if (!j.contains(key)) return def;
  const json& v = j[key];
  double x = v.is_number() ? v.get<double>() : -1;
  if (!v.is_number() || !(x >= lo && x <= hi))
    return field_error(prefix + key,
                       "must be a number from " + json(lo).dump() + " to " + json(hi).dump());
  return x;
}
Result<bool> bool_member(const json& j, const char* key, const std::string& prefix) {
  if (!j.contains(key)) return false;
  if (!j[key].is_boolean()) return field_error(prefix + key, "must be true or false");
  return j[key].get<bool>();
}
}  // namespace

Result<AutoscaleSpec> parse_autoscale_spec(const json& a, const JobResources& per_task,
                                           const std::map<std::string, uint16_t>& ports) {
  const std::string p = "autoscale.";
  if (!a.is_object()) return field_error("autoscale", "must be an object");
  for (const auto& [k, v] : a.items())
    if (k != "min" && k != "max" && k != "metric" && k != "target" && k != "tolerance" &&
        k != "scale_down_window" && k != "predictive" && k != "paused" && k != "app_metric")
      return field_error(p + k, "unknown field");
  AutoscaleSpec s;
  if (!a.contains("min")) return field_error(p + "min", "is required");
  if (!a.contains("max")) return field_error(p + "max", "is required");
  TRY_ASSIGN(auto mn, int_member(a, "min", 1, 1, kMaxTasksPerJob, p));
  TRY_ASSIGN(auto mx, int_member(a, "max", 1, 1, kMaxTasksPerJob, p));
  if (mx < mn) return field_error(p + "max", "must be at least min (" + std::to_string(mn) + ")");
  s.min = static_cast<int>(mn);
  s.max = static_cast<int>(mx);
  TRY_ASSIGN(std::string metric, str_field(a, "metric", p));
  if (metric == "memory")
    s.metric = AutoscaleMetric::kMemory;
  else if (metric == "app")
    s.metric = AutoscaleMetric::kApp;
  else if (!metric.empty() && metric != "cpu")
    return field_error(p + "metric", "must be \"cpu\" (the default), \"memory\" or \"app\"");
  if (a.contains("app_metric") != (s.metric == AutoscaleMetric::kApp))
    return field_error(p + "app_metric", "goes with metric = \"app\", and only with it");
  if (s.metric == AutoscaleMetric::kApp) {
    const json& m = a["app_metric"];
    const std::string q = p + "app_metric.";
    if (!m.is_object()) return field_error(p + "app_metric", "must be a table: port, path, name");
    for (const auto& [k, v] : m.items())
      if (k != "port" && k != "path" && k != "name") return field_error(q + k, "unknown field");
    TRY_ASSIGN(s.app.port, str_field(m, "port", q));
    if (!ports.count(s.app.port))
      return field_error(q + "port", "must be one of the job's ports (ports = { name = ... })");
    TRY_ASSIGN(std::string path, str_field(m, "path", q));
    if (!path.empty()) s.app.path = path;
    bool path_ok = s.app.path.size() <= 256 && s.app.path[0] == '/' &&
                   std::all_of(s.app.path.begin(), s.app.path.end(),
                               [](char c) { return c > 0x20 && c < 0x7f && c != '#'; });
    if (!path_ok)
      return field_error(q + "path",
                         "must be a URL path of at most 256 characters, such as "
                         "\"/metrics\"");
    TRY_ASSIGN(s.app.name, str_field(m, "name", q));
    if (!valid_metric_name(s.app.name))
      return field_error(q + "name", "must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
  if (s.metric == AutoscaleMetric::kCpu && per_task.cpu_milli <= 0)
    return field_error(p + "metric",
                       "cpu needs per_task.cpu_milli (resources.cpu): the target is a fraction "
                       "of it");
  if (s.metric == AutoscaleMetric::kMemory && per_task.mem_mb <= 0)
    return field_error(p + "metric",
                       "memory needs per_task.mem_mb (resources.memory): the target is a "
                       "fraction of it");
  if (s.metric == AutoscaleMetric::kApp) {
    // The metric's own value per ready task: required, there is no sensible default.
    if (!a.contains("target"))
      return field_error(p + "target", "is required with metric = \"app\"");
    TRY_ASSIGN(s.target, number_member(a, "target", 1, 1e-6, 1e12, p));
  } else {
    TRY_ASSIGN(s.target, number_member(a, "target", 0.7, 0.01, 10, p));
  }
  TRY_ASSIGN(s.tolerance, number_member(a, "tolerance", 0.1, 0, 0.5, p));
  if (a.contains("scale_down_window")) {
    const json& d = a["scale_down_window"];
    Result<uint64_t> us = d.is_string()   ? parse_duration_us(d.get<std::string>())
                          : d.is_number() ? seconds_to_us(d.get<double>())
                                          : Result<uint64_t>(make_error("must be a duration"));
    if (!us.ok() || *us > 3'600'000'000)
      return field_error(p + "scale_down_window",
                         "must be a duration of at most an hour, such as \"5m\"");
    s.down_window_us = *us;
  }
  TRY_ASSIGN(s.predictive, bool_member(a, "predictive", p));
  TRY_ASSIGN(s.paused, bool_member(a, "paused", p));
  return s;
}

json to_json(const AutoscaleSpec& a) {
  json out{{"min", a.min},
           {"max", a.max},
           {"metric", autoscale_metric_name(a.metric)},
           {"target", a.target},
           {"tolerance", a.tolerance},
           {"scale_down_window", std::to_string(a.down_window_us) + "us"},
           {"predictive", a.predictive},
           {"paused", a.paused}};
  if (a.metric == AutoscaleMetric::kApp)
    out["app_metric"] = {{"port", a.app.port}, {"path", a.app.path}, {"name", a.app.name}};
  return out;
}

namespace {
Status parse_job_kind(const json& j, JobSpec* s);
}  // namespace

Result<JobSpec> parse_job_spec(const json& j) {
  if (!j.is_object()) return field_error("job", "must be an object");
  for (const auto& [k, v] : j.items()) {
    static const char* kKeys[] = {"name",
                                  "entitlement",
                                  "count",
                                  "per_task",
                                  "machine_type",
                                  "max_unavailable",
                                  "placement",
                                  "task_controller",
                                  "task",
                                  "ports",
                                  "discovery_drain",
                                  "autoscale",
                                  "rebalance",
                                  "kind",
                                  "batch",
                                  "periodic",
                                  "canary",
                                  "auto_promote",
                                  "copies"};
    bool known = false;
    for (const char* key : kKeys) known |= k == key;
    if (!known) return field_error(k, "unknown field");
  }
  JobSpec s;
  TRY_ASSIGN(s.name, str_field(j, "name"));
  if (!valid_job_name(s.name))
    return field_error("name", "must be 1-" + std::to_string(kMaxJobNameLength) +
                                   " letters, digits, '-' or '_', starting with a letter or "
                                   "digit");
  TRY_ASSIGN(s.entitlement, str_field(j, "entitlement"));
  if (s.entitlement.empty())
    return field_error("entitlement", "is required: an entitlement's name");
  TRY_ASSIGN(auto count, int_member(j, "count", 1, 1, kMaxTasksPerJob));
  s.count = static_cast<int>(count);
  TRY(parse_job_kind(j, &s));
  TRY_ASSIGN(auto mu, int_member(j, "max_unavailable", 1, 1, kMaxTasksPerJob));
  s.max_unavailable = static_cast<int>(mu);
  TRY_ASSIGN(auto canary, int_member(j, "canary", 0, 0, kMaxTasksPerJob));
  s.canary = static_cast<int>(canary);
  if (j.contains("auto_promote") && !j["auto_promote"].is_null()) {
    const json& d = j["auto_promote"];
    Result<uint64_t> us = d.is_string()   ? parse_duration_us(d.get<std::string>())
                          : d.is_number() ? seconds_to_us(d.get<double>())
                                          : Result<uint64_t>(make_error("must be a duration"));
    if (!us.ok() || *us > 86400ull * 1'000'000)
      return field_error("auto_promote", "must be a duration of at most a day, such as \"5m\"");
    if (s.canary == 0)
      return field_error("auto_promote", "goes with canary (the tasks it promotes)");
    s.auto_promote_us = *us;
  }
  if (j.contains("per_task") && !j["per_task"].is_null()) {
    const json& r = j["per_task"];
    if (!r.is_object()) return field_error("per_task", "must be an object");
    for (const auto& [k, v] : r.items())
      if (k != "cpu_milli" && k != "mem_mb") return field_error("per_task." + k, "unknown field");
    // 100,000 cores and 1 PiB: far above any machine, far below an overflow when summed.
    TRY_ASSIGN(s.per_task.cpu_milli, int_member(r, "cpu_milli", 0, 0, 100'000'000, "per_task."));
    TRY_ASSIGN(s.per_task.mem_mb, int_member(r, "mem_mb", 0, 0, int64_t{1} << 30, "per_task."));
  }
  TRY_ASSIGN(s.machine_type, str_field(j, "machine_type"));
  TRY_ASSIGN(std::string placement, str_field(j, "placement"));
  if (placement == "pack")
    s.placement = PlacementPolicy::kPack;
  else if (!placement.empty() && placement != "spread")
    return field_error("placement", "must be \"spread\" (the default) or \"pack\"");

  if (j.contains("task_controller") && !j["task_controller"].is_null()) {
    const json& c = j["task_controller"];
    if (!c.is_object()) return field_error("task_controller", "must be an object");
    for (const auto& [k, v] : c.items())
      if (k != "address" && k != "job" && k != "port" && k != "timeout_ms" &&
          k != "when_unreachable" && k != "identity")
        return field_error("task_controller." + k, "unknown field");
    TaskControllerSpec tc;
    TRY_ASSIGN(tc.address, str_field(c, "address", "task_controller."));
    TRY_ASSIGN(tc.job, str_field(c, "job", "task_controller."));
    if (tc.address.empty() == tc.job.empty())
      return field_error("task_controller.address",
                         "give either address (\"host:port\" or \"unix:/path\") or job and port");
    if (!tc.address.empty()) {
      if (c.contains("port"))
        return field_error("task_controller.port", "goes with job, not with address");
      if (auto ep = rpc::parse_endpoint(tc.address); !ep.ok())
        return field_error("task_controller.address", ep.error().message);
    } else {
      if (!valid_job_name(tc.job)) return field_error("task_controller.job", "is not a job name");
      if (tc.job == s.name)
        return field_error("task_controller.job", "a job cannot be its own controller");
      if (!c.contains("port")) return field_error("task_controller.port", "is required with job");
      TRY_ASSIGN(auto port, int_member(c, "port", 0, 1, 65535, "task_controller."));
      tc.port = static_cast<uint16_t>(port);
    }
    TRY_ASSIGN(auto t, int_member(c, "timeout_ms", 10'000, 100, 3'600'000, "task_controller."));
    tc.timeout_ms = static_cast<uint64_t>(t);
    TRY_ASSIGN(std::string when, str_field(c, "when_unreachable", "task_controller."));
    if (when == "wait")
      tc.wait_when_unreachable = true;
    else if (!when.empty() && when != "proceed")
      return field_error("task_controller.when_unreachable",
                         "must be \"proceed\" (the default: max_unavailable pacing) or \"wait\"");
    TRY_ASSIGN(tc.identity, str_field(c, "identity", "task_controller."));
    if (!tc.identity.empty()) {
      bool name_ok = tc.identity.size() <= 253 &&
                     std::all_of(tc.identity.begin(), tc.identity.end(), [](char ch) {
                       return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' ||
                              ch == '-' || ch == '_' || ch == '*';
                     });
      if (!name_ok)
        return field_error("task_controller.identity",
                           "must be a certificate name (a host name, at most 253 characters)");
    }
    s.controller = std::move(tc);
  }
  // Which jobs are fenced by their machines' leases (docs/jobs.md, "At most one copy").
  s.copies = s.controller ? JobCopies::kAtMostOne : JobCopies::kAny;
  if (j.contains("copies")) {
    const json& c = j["copies"];
    if (c == "at_most_one")
      s.copies = JobCopies::kAtMostOne;
    else if (c == "any")
      s.copies = JobCopies::kAny;
    else
      return field_error("copies", "must be \"at_most_one\" or \"any\"");
  }

  if (j.contains("ports") && !j["ports"].is_null()) {
    const json& ports = j["ports"];
    if (!ports.is_object() || ports.size() > kMaxTaskPorts)
      return field_error("ports", "must be a table of at most " + std::to_string(kMaxTaskPorts) +
                                      " names and port numbers (0: one the control plane picks)");
    for (const auto& [name, v] : ports.items()) {
      if (!valid_port_name(name))
        return field_error("ports." + name,
                           "a port's name is 1-15 lowercase letters, digits and '-', starting "
                           "with a letter");
      TRY_ASSIGN(auto port, int_member(ports, name.c_str(), 0, 0, 65535, "ports."));
      // A guest on other entitlements' machines claims no fixed port there.
      if (port != 0 && s.batch.opportunistic)
        return field_error("ports." + name,
                           "an opportunistic batch job's ports are picked from the machine's "
                           "range: give 0");
      s.ports[name] = static_cast<uint16_t>(port);
    }
  }
  if (j.contains("discovery_drain") && !j["discovery_drain"].is_null()) {
    const json& d = j["discovery_drain"];
    Result<uint64_t> us = d.is_string()   ? parse_duration_us(d.get<std::string>())
                          : d.is_number() ? seconds_to_us(d.get<double>())
                                          : Result<uint64_t>(make_error("must be a duration"));
    if (!us.ok() || *us > 600'000'000)
      return field_error("discovery_drain",
                         "must be a duration of at most 10 minutes, such as \"5s\"");
    s.discovery_drain_us = *us;
  }
  if (j.contains("autoscale") && !j["autoscale"].is_null()) {
    // `count` is the size to start with: autoscaling brings it within min and max at
    // its next round (a stored job keeps the size autoscaling gave it, whatever its
    // settings became since).
    TRY_ASSIGN(s.autoscale, parse_autoscale_spec(j["autoscale"], s.per_task, s.ports));
    if (s.is_batch())
      return field_error("autoscale", "a batch job's size is its batch.parallelism");
  }
  if (j.contains("rebalance")) {
    if (!j["rebalance"].is_boolean()) return field_error("rebalance", "must be true or false");
    s.rebalance = j["rebalance"].get<bool>();
  }
  if (!j.contains("task") || !j["task"].is_object())
    return field_error("task", "is required: the task spec to run (an object)");
  s.task = j["task"];
  if (s.task.contains("ports"))
    return field_error("task.ports", "are named by the job (ports = {...}), not its task");
  for (const char* key : {"name", "owner", "at_most_one"})
    if (s.task.contains(key))
      return field_error(std::string("task.") + key,
                         "is set by the control plane (each task gets its own id)");
  if (s.is_batch() && s.task.contains("restart") && s.task["restart"].is_object() &&
      s.task["restart"].value("policy", json("never")) != json("never"))
    return field_error("task.restart.policy",
                       "a batch job's failed tasks are retried by the control plane "
                       "(batch.max_failures): leave it \"never\"");
  // The agent's own validator, on the task exactly as an agent will receive it (with the
  // longest id this job's tasks can have).
  auto task =
      parse_task_spec(task_run_params(s, make_task_id(s.name, kMaxTasksPerJob - 1, UINT64_MAX)));
  if (!task.ok()) {
    Error e = std::move(task).error();
    e.field = e.field.empty() ? "task" : "task." + e.field;
    return e;
  }
  return s;
}

const char* copies_name(JobCopies c) {
  return c == JobCopies::kAtMostOne ? "at_most_one" : "any";
}

const char* overlap_name(PeriodOverlap o) {
  return o == PeriodOverlap::kForbid    ? "forbid"
         : o == PeriodOverlap::kReplace ? "replace"
                                        : "allow";
}

std::string period_run_name(const std::string& job, int64_t period) {
  return job + "-" + std::to_string(period);
}

namespace {
// "kind", "batch" and "periodic" (a batch job's count is its batch.parallelism).
Status parse_job_kind(const json& j, JobSpec* s) {
  TRY_ASSIGN(std::string kind, str_field(j, "kind"));
  if (kind == "batch")
    s->kind = JobKind::kBatch;
  else if (!kind.empty() && kind != "service")
    return field_error("kind", "must be \"service\" (the default) or \"batch\"");
  auto present = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (!s->is_batch()) {
    for (const char* k : {"batch", "periodic"})
      if (present(k)) return field_error(k, "goes with kind = \"batch\"");
    return {};
  }
  if (present("count"))
    return field_error("count",
                       "a batch job runs batch.parallelism tasks at once and "
                       "batch.completions in all: it has no count");
  const json none = json::object();
  const json& b = present("batch") ? j["batch"] : none;
  if (!b.is_object()) return field_error("batch", "must be a table");
  const std::string p = "batch.";
  for (const auto& [k, v] : b.items())
    if (k != "completions" && k != "parallelism" && k != "max_failures" && k != "deadline" &&
        k != "opportunistic" && k != "notice")
      return field_error(p + k, "unknown field");
  TRY_ASSIGN(auto completions, int_member(b, "completions", 1, 1, kMaxTasksPerJob, p));
  s->batch.completions = static_cast<int>(completions);
  TRY_ASSIGN(auto parallelism, int_member(b, "parallelism", 1, 1, kMaxTasksPerJob, p));
  if (parallelism > completions)
    return field_error(p + "parallelism",
                       "must be at most completions (" + std::to_string(completions) + ")");
  s->count = static_cast<int>(parallelism);
  TRY_ASSIGN(auto failures, int_member(b, "max_failures", 6, 0, 10000, p));
  s->batch.max_failures = static_cast<int>(failures);
  if (b.contains("deadline") && !b["deadline"].is_null()) {
    const json& d = b["deadline"];
    Result<uint64_t> us = d.is_string()   ? parse_duration_us(d.get<std::string>())
                          : d.is_number() ? seconds_to_us(d.get<double>())
                                          : Result<uint64_t>(make_error("must be a duration"));
    if (!us.ok() || *us == 0 || *us > 30ull * 86400 * 1'000'000)
      return field_error(p + "deadline", "must be a duration of at most 30 days, such as \"1h\"");
    s->batch.deadline_us = *us;
  }
  if (b.contains("opportunistic") && !b["opportunistic"].is_null()) {
    if (!b["opportunistic"].is_boolean())
      return field_error(p + "opportunistic", "must be true or false");
    s->batch.opportunistic = b["opportunistic"].get<bool>();
  }
  if (b.contains("notice") && !b["notice"].is_null()) {
    if (!s->batch.opportunistic)
      return field_error(p + "notice", "goes with batch.opportunistic = true");
    const json& d = b["notice"];
    Result<uint64_t> us = d.is_string()   ? parse_duration_us(d.get<std::string>())
                          : d.is_number() ? seconds_to_us(d.get<double>())
                                          : Result<uint64_t>(make_error("must be a duration"));
    if (!us.ok() || *us < 1'000'000 || *us > 600'000'000)
      return field_error(p + "notice", "must be a duration from 1s to 10m, such as \"30s\"");
    s->batch.notice_us = *us;
  }
  if (present("periodic")) {
    const json& r = j["periodic"];
    const std::string q = "periodic.";
    if (!r.is_object())
      return field_error("periodic", "must be a table: schedule, overlap, max_running");
    for (const auto& [k, v] : r.items())
      if (k != "schedule" && k != "overlap" && k != "max_running")
        return field_error(q + k, "unknown field");
    PeriodicSpec ps;
    TRY_ASSIGN(ps.schedule, str_field(r, "schedule", q));
    if (ps.schedule.empty())
      return field_error(q + "schedule", "is required: a cron schedule, such as \"0 * * * *\"");
    auto cron = parse_cron(ps.schedule);
    if (!cron.ok()) return field_error(q + "schedule", cron.error().message);
    if (int64_t gap = cron->shortest_gap(); gap < kMinPeriodSeconds)
      return field_error(q + "schedule", "names times " + std::to_string(gap) +
                                             " s apart: periods must be at least " +
                                             std::to_string(kMinPeriodSeconds) + " s apart");
    TRY_ASSIGN(int64_t max_running,
               int_member(r, "max_running", kDefaultMaxRunning, 1, kMaxMaxRunning, q));
    ps.max_running = static_cast<int>(max_running);
    TRY_ASSIGN(std::string overlap, str_field(r, "overlap", q));
    if (overlap == "forbid")
      ps.overlap = PeriodOverlap::kForbid;
    else if (overlap == "replace")
      ps.overlap = PeriodOverlap::kReplace;
    else if (!overlap.empty() && overlap != "allow")
      return field_error(q + "overlap",
                         "must be \"allow\" (the default), \"forbid\" or \"replace\"");
    if (s->name.size() > kMaxPeriodicNameLength)
      return field_error("name", "a periodic job's name has at most " +
                                     std::to_string(kMaxPeriodicNameLength) +
                                     " characters (its runs add \"-<unix time>\")");
    s->periodic = std::move(ps);
  }
  return {};
}
}  // namespace

json to_json(const JobSpec& s) {
  json out{{"name", s.name},
           {"entitlement", s.entitlement},
           {"count", s.count},
           {"per_task", {{"cpu_milli", s.per_task.cpu_milli}, {"mem_mb", s.per_task.mem_mb}}},
           {"machine_type", s.machine_type},
           {"max_unavailable", s.max_unavailable},
           {"placement", placement_name(s.placement)},
           {"task", s.task}};
  if (!s.ports.empty()) out["ports"] = s.ports;
  if (s.discovery_drain_us) out["discovery_drain"] = std::to_string(s.discovery_drain_us) + "us";
  if (s.autoscale) out["autoscale"] = to_json(*s.autoscale);
  if (!s.rebalance) out["rebalance"] = false;
  out["copies"] = copies_name(s.copies);
  if (s.canary) out["canary"] = s.canary;
  if (s.auto_promote_us) out["auto_promote"] = std::to_string(s.auto_promote_us) + "us";
  if (s.is_batch()) {
    out.erase("count");
    out["kind"] = "batch";
    out["batch"] = {{"completions", s.batch.completions},
                    {"parallelism", s.count},
                    {"max_failures", s.batch.max_failures}};
    if (s.batch.deadline_us) out["batch"]["deadline"] = std::to_string(s.batch.deadline_us) + "us";
    if (s.batch.opportunistic) {
      out["batch"]["opportunistic"] = true;
      out["batch"]["notice"] = std::to_string(s.batch.notice_us) + "us";
    }
    if (s.periodic)
      out["periodic"] = {{"schedule", s.periodic->schedule},
                         {"overlap", overlap_name(s.periodic->overlap)},
                         {"max_running", s.periodic->max_running}};
  }
  if (s.controller) {
    out["task_controller"] = {
        {"timeout_ms", s.controller->timeout_ms},
        {"when_unreachable", s.controller->wait_when_unreachable ? "wait" : "proceed"}};
    if (!s.controller->identity.empty())
      out["task_controller"]["identity"] = s.controller->identity;
    if (s.controller->job.empty()) {
      out["task_controller"]["address"] = s.controller->address;
    } else {
      out["task_controller"]["job"] = s.controller->job;
      out["task_controller"]["port"] = s.controller->port;
    }
  }
  return out;
}

}  // namespace weft
