// The scheduler's vocabulary (scheduler.h): a job as the scheduler holds it (its spec
// with the entitlement's id, its progress and revisions), a task's record and what
// happened to it, a command for a machine, and a TaskControl operation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/job_spec.h"
#include "common/result.h"
#include "common/task_report.h"
#include "common/task_state.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

using weft::kMaxTasksPerJob;
using weft::task_state_name;
using weft::TaskState;

// The scheduler's form of a job (common/job_spec.h): the operator's spec with its
// entitlement resolved to the entitlement's id.
struct JobSpec : weft::JobSpec {
  EntitlementId entitlement_id = 1;
};

struct TaskRecord {
  std::string id;  // "<job>.<index>.<generation>": unique across replacements
  std::string job;
  int index = 0;
  uint64_t generation = 0;  // the job spec generation it runs
  MachineId machine = 0;
  TaskState state = TaskState::kPending;
  uint64_t since_us = 0;
  // Why it failed when the machine said so: the agent's refusal of its start
  // ("task.resources.hugetlb: ..."), shown by job.show.
  std::string message;
  // Its spec was refused: no replacement until the job's spec changes.
  bool held = false;
  // Setup failures in a row of this index (this task's and its predecessors'), all with
  // `setup_reason`. Not stored: a restarted control plane counts again.
  int setup_failures = 0;
  std::string setup_reason;
  // Running and its readiness check passes (or it has none): its machine reports it
  // "ready". Not stored: a restarted control plane learns it from the next report.
  bool ready = false;
  // Its named ports on its machine (the job's fixed ones and those taken from the
  // machine's range): what it was started with and what service discovery publishes.
  std::map<std::string, uint16_t> ports;
  // Its job's entitlement when it was made (put_task): its output belongs there, also
  // once the job is gone and another job has its name.
  EntitlementId entitlement = 0;
  // A guest's task (an opportunistic batch job's) whose room its machine's owner took
  // back: stopping with its job's notice, then placed again elsewhere (not a failure;
  // a batch index that finished within its notice is done). Stored with the task, so
  // that the next leader knows why it stops.
  bool preempted = false;
  // A task of an at-most-one job being moved (a drain, the ReBalancer): break before
  // make, it stops first and its index starts again where its slot now is once the stop
  // is confirmed. Not stored: a restarted control plane sees a stopping task, and starts
  // its index once it stopped, as it would anyway.
  bool moving = false;
};
// Placed and not ended: pending, starting or running.
inline bool task_live(TaskState s) {
  return s == TaskState::kPending || s == TaskState::kStarting || s == TaskState::kRunning;
}
// Live, or running on a drained machine until its replacement runs: what a stop or a
// scale-down must stop, and what keeps a stopping job alive.
inline bool running_copy(TaskState s) {
  return task_live(s) || s == TaskState::kDraining;
}
// Counted as available by rolling updates, drains and TaskControllers.
inline bool available(const TaskRecord& t) {
  return t.state == TaskState::kRunning && t.ready;
}

struct Command {
  // kPrefetch: ask the machine to fetch spec["fetch"] ({"image", "package"}: what the
  // update changed) now; task_id is the job's name and spec["generation"] the update's.
  enum class Kind { kStart, kStop, kPrefetch } kind;
  MachineId machine;
  std::string task_id;
  nlohmann::json spec;  // kPrefetch: what to fetch
  // kStart: the job's task.run body, serialised once per job and generation and shared
  // by its starts (weft::task_run_body), and this task's ports.
  std::shared_ptr<const std::string> body;
  std::map<std::string, uint16_t> ports;
  // kStart: the task.run parameters (`extra`: more keys, see weft::task_run_text).
  std::string run_text(std::string_view extra = {}) const {
    return weft::task_run_text(body ? *body : std::string("{}"), task_id, ports, extra);
  }
  nlohmann::json run_params() const { return nlohmann::json::parse(run_text()); }
};

// How long a rolling update waits for a machine to fetch the new image before it stops
// that machine's old task anyway (the start then waits for the fetch).
inline constexpr uint64_t kPrefetchTimeoutUs = 10ull * 60 * 1'000'000;

// TaskControl (docs/taskcontrol.md): an operation the scheduler wants to perform on a
// task of a job that names a TaskController, and performs only once the controller
// acknowledged it (or, the controller unreachable, at max_unavailable pacing).
struct Operation {
  std::string id;    // "<kind>/<task id>": the same operation keeps its id across asks
  std::string kind;  // "restart", "move", "stop"; "preempt": told, not asked (a guest's notice)
  std::string task;
  int index = 0;
  std::string reason;
};

// A job's task as its controller sees it: the newest task of each index.
struct ControlledTask {
  std::string task;
  int index = 0;
  std::string machine;  // filled in by the caller (the scheduler knows machine ids)
  MachineId machine_id = 0;
  uint64_t generation = 0;
  TaskState state = TaskState::kPending;
  std::string message;
  bool ready = false;
};

// Something that happened to a task, for its job's events (job.events): "placed",
// a state it entered ("starting", "running", "failed", "lost", "stopping", "draining",
// "stopped"), "ready" or "not ready", or an operation asked of it ("restart asked",
// "move asked") with its reason in `detail`.
struct TaskEvent {
  std::string job, task;
  MachineId machine = 0;
  std::string what, detail;
};

// One of a job's specs as it was created or updated (docs/jobs.md, "Rollouts"): its
// generation, the spec's protocol form, when and by whom.
struct Revision {
  uint64_t generation = 0;
  nlohmann::json spec;
  uint64_t at_us = 0;  // monotonic (stored as wall-clock time)
  std::string note;    // "created by CN=alice", "revert to generation 3 by ..."
  bool operator==(const Revision&) const = default;
};
inline constexpr size_t kRevisionsKept = 10;

// A job's state beyond its spec: a batch job's progress (docs/jobs.md, "Batch jobs"), a
// periodic job's last period, its rollout's pause and canary phase and its last
// revisions (docs/jobs.md, "Rollouts"): kept with the job, across restarts, failovers
// and moves between shards.
struct JobProgress {
  int succeeded = 0;                // batch: tasks that exited 0
  int failed = 0;                   // batch: failures counted against batch.max_failures
  std::string outcome;              // batch: "" while it runs, "succeeded" or "failed"
  std::string reason;               // why it ended; while it runs, its last failure
  uint64_t started_us = 0;          // batch: made (its deadline counts from here)
  uint64_t ended_us = 0;            // batch: when outcome was set
  int64_t last_period = 0;          // periodic: the newest period (unix seconds) run or skipped
  std::string parent;               // a periodic job's run: that job
  bool paused = false;              // its rollouts hold (weftctl job rollout pause)
  bool canary = false;              // its update's canaries wait for a promotion
  std::vector<Revision> revisions;  // the latest kRevisionsKept, oldest first
  bool operator==(const JobProgress&) const = default;
};
// Its stored and carried form: `time_of` turns the monotonic times into the form's own
// (wall-clock µs in a store, ages in a move document), `mono_of` back. A hostile or
// malformed member reads as its default.
nlohmann::json progress_json(const JobProgress& p, const std::function<int64_t(uint64_t)>& time_of);
JobProgress progress_from_json(const nlohmann::json& j,
                               const std::function<uint64_t(int64_t)>& mono_of);

// An index whose tasks failed this many times in a row before their program ran, with
// one reason, is held (see Scheduler::report_list).
inline constexpr int kSetupFailuresHeld = 3;

struct SchedulerLimits {
  double destructive_per_min = 60;  // replacements + stops caused by failures
  double destructive_burst = 20;
};

}  // namespace weft::cp
