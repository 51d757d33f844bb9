// An agent's task report (machine.report, docs/protocol.md), shared by weft-agent, which
// sends it, and weft-controlplane, which reads it.
//
// A report carries one of:
// - the machine's whole task list, {"tasks": {id: state}};
// - what changed since the list the control plane acknowledged, {"base": <that list's
//   digest>, "changes": {id: state or null (gone)}, "digest": <the new list's digest>}:
//   a task starting on a machine that runs 200 costs one entry, not 200;
// - when nothing changed, only the list's digest, {"digest": "..."}: a heartbeat then
//   costs the same whatever the machine runs.
// A control plane that does not hold the base or digest (it restarted, or the lists
// disagree) answers {"resend": true} and the agent sends the whole list at once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/task_state.h"

namespace weft {

// Task ids and states as sent, in id order.
using TaskList = std::vector<std::pair<std::string, TaskState>>;
// Changes to a task list, in id order: a new state, or nullopt for a task gone from it.
using TaskChanges = std::vector<std::pair<std::string, std::optional<TaskState>>>;

// The digest of a task list: for each entry the first 128 bits of SHA-256("<id> <state>"),
// as two little-endian 64-bit words, summed word by word (mod 2^64) over the list; as 32
// lowercase hex digits. A sum, so that it is kept up to date entry by entry.
class TaskDigest {
 public:
  void add(std::string_view id, std::string_view state);
  void remove(std::string_view id, std::string_view state);
  std::string hex() const;

 private:
  uint64_t a_ = 0, b_ = 0;
};
std::string tasks_digest(const std::map<std::string, std::string>& states);
std::string tasks_digest(const TaskList& tasks);

// Why a task the report names as failed failed, as its machine says: the agent's reason
// ("task setup failed: ...", "exited with code 1") and whether it failed before its
// program ran (`setup`: restarting it the same way would fail the same way). Outside the
// digest: a note beside the list, not part of it.
struct TaskFailure {
  std::string reason;
  bool setup = false;
};
using TaskFailures = std::map<std::string, TaskFailure>;
inline constexpr size_t kMaxFailureReason = 512;

struct TaskReport {
  std::string machine;                 // "machine", as sent (checked by the control plane)
  std::optional<TaskList> tasks;       // the whole list, when sent
  std::optional<TaskChanges> changes;  // or the changes since the list digested `base`
  std::string base;
  std::string digest;     // of `tasks` when sent (computed here), else as claimed
  TaskFailures failures;  // "failures": {id: {"reason", "setup"}}, with tasks or changes
};

// The one reader of a report's params: "tasks" (an object of at most kMaxReportedTasks
// task id -> state names of common/task_state.h), or "changes" (at most as many; a state
// or null) with "base" and "digest", or "digest" alone (32 hex digits); with either list,
// "failures" (at most as many; a reason longer than kMaxFailureReason bytes is cut); a
// member or a task named twice is refused; errors name the field.
//
// It reads the params' JSON text straight into the report (simdjson's on-demand API: the
// bytes are read once and no document is built; members it does not know are skipped
// unread), as the control plane gets them on its hot path (rpc::Dispatcher::add_raw).
inline constexpr size_t kMaxReportedTasks = 100000;
Result<TaskReport> parse_task_report(std::string_view params_json);
// The same of a document (its text): tests and tools.
Result<TaskReport> parse_task_report(const nlohmann::json& params);
// The "machine" a report's params name, or "" (for a report parse_task_report refused).
std::string report_machine(std::string_view params_json);

// Applies changes to a list (kept in id order) and its digest. Removing a task the list
// does not hold changes nothing (the digests then disagree, and the list is sent again).
// The entries applied (a state set or a task removed) are returned, in id order.
TaskChanges apply_task_changes(TaskList& list, TaskDigest& digest, const TaskChanges& changes);

// What an agent sends: the changes from `acked` (the list the control plane holds) to
// `now`, both id -> state name.
nlohmann::json task_changes_json(const std::map<std::string, std::string>& acked,
                                 const std::map<std::string, std::string>& now);

}  // namespace weft
