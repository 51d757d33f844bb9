#include "common/task_usage.h"

#include <algorithm>
#include <cmath>

#include "common/prometheus_text.h"

namespace weft {

using json = nlohmann::json;

namespace {
constexpr uint64_t kMaxFigure = uint64_t{1} << 53;  // exact in a double, as JSON readers hold it
constexpr size_t kMaxTaskIdLength = 255;
// A whole number from 0 to `max` (as sent, or as a document made in memory holds it).
bool whole(const json& v, uint64_t max) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= max;
  return v.is_number_integer() && v.get<int64_t>() >= 0 &&
         static_cast<uint64_t>(v.get<int64_t>()) <= max;
}
}  // namespace

json to_json(const UsageReport& r) {
  json tasks = json::object();
  for (const auto& [id, u] : r.tasks) {
    json a = json::array({u.cpu_milli, u.mem_bytes, u.io_read_bps, u.io_write_bps});
    if (u.metric) a.push_back(*u.metric);
    tasks[id] = std::move(a);
  }
  json out{{"interval_ms", r.interval_ms}, {"tasks", std::move(tasks)}};
  if (!r.scrape_errors.empty()) out["scrape_errors"] = r.scrape_errors;
  return out;
}

json to_json(const UsageRequest& r) {
  json out = json::object();
  if (!r.tasks.empty()) out["tasks"] = r.tasks;
  if (!r.scrape.empty()) {
    json groups = json::array();
    for (const auto& g : r.scrape)
      groups.push_back({{"tasks", g.tasks}, {"port", g.port}, {"path", g.path}, {"name", g.name}});
    out["scrape"] = std::move(groups);
  }
  return out;
}

Result<UsageReport> parse_usage_report(const json& j) {
  if (!j.is_object()) return field_error("usage", "must be an object");
  UsageReport r;
  if (j.contains("interval_ms")) {
    const json& i = j["interval_ms"];
    if (!whole(i, 86'400'000))
      return field_error("interval_ms", "must be an integer of milliseconds, at most a day");
    r.interval_ms = i.get<uint64_t>();
  }
  if (!j.contains("tasks")) return r;
  const json& tasks = j["tasks"];
  if (!tasks.is_object() || tasks.size() > kMaxUsageTasks)
    return field_error(
        "tasks", "must be an object of at most " + std::to_string(kMaxUsageTasks) + " task ids");
  for (const auto& [id, v] : tasks.items()) {
    std::string field = "tasks." + id.substr(0, kMaxTaskIdLength);
    if (id.empty() || id.size() > kMaxTaskIdLength)
      return field_error("tasks", "a task id is 1-255 characters");
    if (!v.is_array() || (v.size() != 4 && v.size() != 5))
      return field_error(field,
                         "must be [cpu_milli, memory_bytes, io_read_Bps, io_write_Bps(, metric)]");
    uint64_t f[4];
    for (size_t i = 0; i < 4; ++i) {
      if (!whole(v[i], kMaxFigure))
        return field_error(field + "[" + std::to_string(i) + "]",
                           "must be an integer from 0 to 2^53");
      f[i] = v[i].get<uint64_t>();
    }
    TaskUsage u{f[0], f[1], f[2], f[3], std::nullopt};
    if (v.size() == 5) {
      if (!v[4].is_number() || !std::isfinite(v[4].get<double>()))
        return field_error(field + "[4]", "must be a finite number");
      u.metric = v[4].get<double>();
    }
    r.tasks[id] = u;
  }
  if (j.contains("scrape_errors")) {
    const json& e = j["scrape_errors"];
    if (!e.is_object() || e.size() > kMaxScrapeErrors)
      return field_error("scrape_errors", "must be an object of at most " +
                                              std::to_string(kMaxScrapeErrors) + " task ids");
    for (const auto& [id, why] : e.items()) {
      if (id.empty() || id.size() > kMaxTaskIdLength || !why.is_string())
        return field_error("scrape_errors", "maps task ids to reasons");
      r.scrape_errors[id] = why.get<std::string>().substr(0, 256);
    }
  }
  return r;
}

namespace {
Result<std::vector<std::string>> task_ids(const json& t, const std::string& field) {
  std::vector<std::string> out;
  if (!t.is_array() || t.size() > kMaxUsageTasks)
    return field_error(field,
                       "must be a list of at most " + std::to_string(kMaxUsageTasks) + " task ids");
  out.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].is_string() || t[i].get_ref<const std::string&>().empty() ||
        t[i].get_ref<const std::string&>().size() > kMaxTaskIdLength)
      return field_error(field + "[" + std::to_string(i) + "]", "must be a task id");
    out.push_back(t[i].get<std::string>());
  }
  return out;
}
}  // namespace

Result<UsageRequest> parse_usage_request(const json& j) {
  UsageRequest out;
  if (j.is_null()) return out;
  if (!j.is_object()) return field_error("params", "must be an object");
  for (const auto& [k, v] : j.items())
    if (k != "tasks" && k != "scrape") return field_error(k, "unknown field");
  if (j.contains("tasks")) {
    TRY_ASSIGN(out.tasks, task_ids(j["tasks"], "tasks"));
  }
  if (!j.contains("scrape")) return out;
  const json& s = j["scrape"];
  if (!s.is_array() || s.size() > kMaxScrapeGroups)
    return field_error("scrape",
                       "must be a list of at most " + std::to_string(kMaxScrapeGroups) + " groups");
  size_t total = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    std::string f = "scrape[" + std::to_string(i) + "]";
    const json& g = s[i];
    if (!g.is_object()) return field_error(f, "must be an object: tasks, port, path, name");
    for (const auto& [k, v] : g.items())
      if (k != "tasks" && k != "port" && k != "path" && k != "name")
        return field_error(f + "." + k, "unknown field");
    ScrapeGroup group;
    TRY_ASSIGN(group.tasks, task_ids(g.value("tasks", json::array()), f + ".tasks"));
    total += group.tasks.size();
    if (total > kMaxUsageTasks) return field_error(f + ".tasks", "too many tasks in all");
    for (const char* key : {"port", "path", "name"})
      if (!g.contains(key) || !g[key].is_string() || g[key].get_ref<const std::string&>().empty() ||
          g[key].get_ref<const std::string&>().size() > 256)
        return field_error(f + "." + key, "is required: a string of at most 256 characters");
    group.port = g["port"].get<std::string>();
    group.path = g["path"].get<std::string>();
    group.name = g["name"].get<std::string>();
    if (group.path[0] != '/' || !std::all_of(group.path.begin(), group.path.end(), [](char c) {
          return c > 0x20 && c < 0x7f && c != '#';
        }))
      return field_error(f + ".path", "must be a URL path");
    if (!valid_metric_name(group.name)) return field_error(f + ".name", "must be a metric name");
    out.scrape.push_back(std::move(group));
  }
  return out;
}

}  // namespace weft
