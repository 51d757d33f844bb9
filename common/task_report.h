// An agent's task report (machine.report, docs/protocol.md), shared by weft-agent, which
// sends it, and weft-controlplane, which reads it.
//
// A report carries either the machine's whole task list, {"tasks": {id: state}}, or,
// when nothing changed since the last list the control plane acknowledged, only the
// list's digest, {"digest": "..."}: a heartbeat then costs the same whatever the machine
// runs. A control plane that does not hold that digest (it restarted, or the lists
// disagree) answers {"resend": true} and the agent sends the whole list at once.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/task_state.h"

namespace weft {

// Task ids and states as sent, in id order.
using TaskList = std::vector<std::pair<std::string, TaskState>>;

// The digest of a task list: SHA-256 over "id state\n" lines in id order, first 128 bits
// in hex (32 characters).
std::string tasks_digest(const std::map<std::string, std::string>& states);
std::string tasks_digest(const TaskList& tasks);

struct TaskReport {
  std::optional<TaskList> tasks;  // the whole list, when sent
  std::string digest;             // of `tasks` when sent (computed here), else as claimed
};

// The one reader of a report's params: "tasks" (an object of at most kMaxReportedTasks
// task id -> state names of common/task_state.h) or "digest" (32 hex digits); errors
// name the field.
inline constexpr size_t kMaxReportedTasks = 100000;
Result<TaskReport> parse_task_report(const nlohmann::json& params);

}  // namespace weft
