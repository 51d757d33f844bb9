#include "common/task_usage.h"

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
  for (const auto& [id, u] : r.tasks)
    tasks[id] = json::array({u.cpu_milli, u.mem_bytes, u.io_read_bps, u.io_write_bps});
  return json{{"interval_ms", r.interval_ms}, {"tasks", std::move(tasks)}};
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
    if (!v.is_array() || v.size() != 4)
      return field_error(field, "must be [cpu_milli, memory_bytes, io_read_Bps, io_write_Bps]");
    uint64_t f[4];
    for (size_t i = 0; i < 4; ++i) {
      if (!whole(v[i], kMaxFigure))
        return field_error(field + "[" + std::to_string(i) + "]",
                           "must be an integer from 0 to 2^53");
      f[i] = v[i].get<uint64_t>();
    }
    r.tasks[id] = TaskUsage{f[0], f[1], f[2], f[3]};
  }
  return r;
}

Result<std::vector<std::string>> parse_usage_request(const json& j) {
  std::vector<std::string> out;
  if (j.is_null()) return out;
  if (!j.is_object()) return field_error("params", "must be an object");
  for (const auto& [k, v] : j.items())
    if (k != "tasks") return field_error(k, "unknown field");
  if (!j.contains("tasks")) return out;
  const json& t = j["tasks"];
  if (!t.is_array() || t.size() > kMaxUsageTasks)
    return field_error("tasks",
                       "must be a list of at most " + std::to_string(kMaxUsageTasks) + " task ids");
  out.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].is_string() || t[i].get_ref<const std::string&>().empty() ||
        t[i].get_ref<const std::string&>().size() > kMaxTaskIdLength)
      return field_error("tasks[" + std::to_string(i) + "]", "must be a task id");
    out.push_back(t[i].get<std::string>());
  }
  return out;
}

}  // namespace weft
