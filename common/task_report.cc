#include "common/task_report.h"

#include "common/tls.h"

namespace weft {

namespace {
constexpr size_t kDigestHex = 32;

std::string digest_of(const std::string& lines) {
  return tls::sha256_hex(lines).substr(0, kDigestHex);
}
}  // namespace

std::string tasks_digest(const std::map<std::string, std::string>& states) {
  std::string lines;
  for (const auto& [id, state] : states) lines += id + ' ' + state + '\n';
  return digest_of(lines);
}

std::string tasks_digest(const TaskList& tasks) {
  std::string lines;
  for (const auto& [id, state] : tasks) lines += id + ' ' + task_state_name(state) + '\n';
  return digest_of(lines);
}

Result<TaskReport> parse_task_report(const nlohmann::json& p) {
  if (!p.is_object()) return field_error("params", "must be an object");
  TaskReport r;
  auto tasks = p.find("tasks");
  if (tasks != p.end()) {
    if (!tasks->is_object()) return field_error("tasks", "must be an object of task id -> state");
    if (tasks->size() > kMaxReportedTasks)
      return field_error("tasks", "more than " + std::to_string(kMaxReportedTasks) + " tasks");
    TaskList list;
    list.reserve(tasks->size());
    for (const auto& [id, st] : tasks->items()) {  // nlohmann's objects iterate in key order
      auto state = st.is_string() ? parse_task_state(st.get<std::string>()) : std::nullopt;
      if (!state) return field_error("tasks." + id, "must be a task state (common/task_state.h)");
      list.emplace_back(id, *state);
    }
    r.digest = tasks_digest(list);
    r.tasks = std::move(list);
    return r;
  }
  auto digest = p.find("digest");
  if (digest == p.end())
    return field_error("tasks", "is required (or \"digest\" when the list is unchanged)");
  if (!digest->is_string() || digest->get_ref<const std::string&>().size() != kDigestHex ||
      digest->get_ref<const std::string&>().find_first_not_of("0123456789abcdef") !=
          std::string::npos)
    return field_error("digest", "must be 32 lowercase hex digits");
  r.digest = digest->get<std::string>();
  return r;
}

}  // namespace weft
