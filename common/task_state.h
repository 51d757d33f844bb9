// The task-state vocabulary shared by weft-agent, weft-controlplane and weftctl: one
// enum and its names (the strings on the wire, in sqlite rows and in the CLI's output).
//
// On a machine (weft-agent): [fetching ->] starting -> running -> stopping -> stopped, or exited /
// failed when the program ends; backoff between a failure and its restart. In its
// reports to the control plane a running task that is available (its readiness check
// passes, or it declares none) is "ready".
// In the control plane (scheduler), per placed task: pending (placed, start not sent) ->
// starting (sent) -> running (reported) -> stopping -> stopped, or failed (it ended, or
// the machine refused to start it), lost (its machine died or stopped reporting it),
// draining (still running on a drained machine until its replacement runs).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace weft {

enum class TaskState {
  kPending,
  kStarting,
  kRunning,
  kBackoff,
  kStopping,
  kStopped,
  kExited,
  kFailed,
  kLost,
  kDraining,
  // Reported by an agent for a running task that is available: its readiness check
  // passes, or it has none. The control plane records it as running and ready.
  kReady,
  // On a machine: the task's image is being fetched and unpacked; it starts when that is
  // done (or fails with the reason). The control plane counts it as started, not ready.
  kFetching,
};
inline constexpr size_t kTaskStateCount = 12;

constexpr const char* task_state_name(TaskState s) {
  switch (s) {
    case TaskState::kPending:
      return "pending";
    case TaskState::kStarting:
      return "starting";
    case TaskState::kRunning:
      return "running";
    case TaskState::kBackoff:
      return "backoff";
    case TaskState::kStopping:
      return "stopping";
    case TaskState::kStopped:
      return "stopped";
    case TaskState::kExited:
      return "exited";
    case TaskState::kFailed:
      return "failed";
    case TaskState::kLost:
      return "lost";
    case TaskState::kDraining:
      return "draining";
    case TaskState::kReady:
      return "ready";
    case TaskState::kFetching:
      return "fetching";
  }
  return "unknown";
}

inline constexpr TaskState kAllTaskStates[] = {
    TaskState::kPending,  TaskState::kStarting, TaskState::kRunning, TaskState::kBackoff,
    TaskState::kStopping, TaskState::kStopped,  TaskState::kExited,  TaskState::kFailed,
    TaskState::kLost,     TaskState::kDraining, TaskState::kReady,   TaskState::kFetching};

static_assert(sizeof(kAllTaskStates) / sizeof(kAllTaskStates[0]) == kTaskStateCount);

// nullopt for a name that is not a state.
constexpr std::optional<TaskState> parse_task_state(std::string_view name) {
  for (TaskState s : kAllTaskStates)
    if (name == task_state_name(s)) return s;
  return std::nullopt;
}

// Ended for good: nothing runs and nothing will restart it.
constexpr bool task_ended(TaskState s) {
  return s == TaskState::kStopped || s == TaskState::kExited || s == TaskState::kFailed ||
         s == TaskState::kLost;
}

// What a machine's report means for the control plane: the task exists on the machine
// and may run (again): starting, running, backoff, stopping.
constexpr bool task_present_on_machine(TaskState s) {
  return s == TaskState::kStarting || s == TaskState::kRunning || s == TaskState::kReady ||
         s == TaskState::kBackoff || s == TaskState::kStopping || s == TaskState::kFetching;
}

}  // namespace weft
