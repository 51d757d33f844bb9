// JobSpec: what an operator asks the control plane to run — N copies of one task spec
// in an entitlement. The one definition and the one validator, used by weftctl (on a
// job file, before sending), by the control plane (before accepting, and on what it
// reads back from its store) and, through the task spec it embeds, by weft-agent (before
// starting): what weftctl accepts, the control plane accepts, and the agent can start on
// any machine that has the cgroup controllers the limits need.
//
// The protocol form (job.create / job.update params, docs/protocol.md):
//   {"name": "web", "entitlement": "frontend", "count": 6, "max_unavailable": 2,
//    "machine_type": "T1", "placement": "spread",
//    "per_task": {"cpu_milli": 500, "mem_mb": 256},
//    "task_controller": {"address": "10.1.2.3:7400", "timeout_ms": 10000,
//                        "when_unreachable": "proceed", "identity": "shardctl.web"},
//    "ports": {"http": 0, "admin": 9100}, "discovery_drain": "5s",
//    "autoscale": {"min": 2, "max": 20, "metric": "cpu", "target": 0.6, "tolerance": 0.1,
//                  "scale_down_window": "5m", "predictive": true, "paused": false},
//    (or "metric": "app", "app_metric": {"port": "http", "path": "/metrics",
//                                        "name": "http_in_flight"}, "target": 20)
//    "task": {<a task spec without name and owner: common/task_spec.h>}}
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

inline constexpr int kMaxTasksPerJob = 100000;
// Task ids are "<job>.<index>.<sequence>" and a task name on a machine has at most 63
// characters: 32 + 1 + 5 (index < 100000) + 1 + 20 (a uint64) = 59.
inline constexpr size_t kMaxJobNameLength = 32;

// How a job's tasks are placed: spread over fault domains and machines first (the
// default: a rack or a machine lost takes as few of the job's tasks as possible), or
// packed onto the fewest machines, the entitlement's own first.
enum class PlacementPolicy { kSpread, kPack };
const char* placement_name(PlacementPolicy p);

// How many copies of one index may run at once while machines are cut off
// (docs/jobs.md, "At most one copy"). kAny: a machine silent for missed_heartbeats is
// counted dead and its tasks start elsewhere at once; the old copy, if it still runs, is
// stopped when the machine comes back. kAtMostOne: its tasks are fenced by the machine's
// lease: the agent stops them on its own when it cannot renew the lease, and the control
// plane starts them elsewhere only after that lease (plus the drift margin) has ended.
enum class JobCopies { kAny, kAtMostOne };
const char* copies_name(JobCopies c);

struct JobResources {  // reserved per task on its machine
  int64_t cpu_milli = 0;
  int64_t mem_mb = 0;
  bool operator==(const JobResources&) const = default;
};

// The job's TaskController (docs/taskcontrol.md): the endpoint the control plane asks
// before it restarts, moves or stops the job's tasks; what happens when it does not
// answer within the timeout: proceed at max_unavailable pacing, or wait for it.
struct TaskControllerSpec {
  std::string address;  // "host:port" or "unix:/path"; or, instead:
  std::string job;      // a job whose ready task (the lowest index) is the controller,
  uint16_t port = 0;    // listening on this port of its machine's address
  uint64_t timeout_ms = 10'000;
  bool wait_when_unreachable = false;
  // The name the controller's certificate must carry (a DNS subjectAltName, else its
  // CN): a control plane with TLS speaks to a TCP controller over mutual TLS only, and
  // only to this name.
  std::string identity;
  bool operator==(const TaskControllerSpec&) const = default;
};

// Autoscaling (docs/jobs.md, "Autoscaling"): the control plane resizes the job between
// `min` and `max` (never past what its entitlement's quota leaves) so that the metric
// per ready task stays near `target`, a fraction of the task's reservation
// (per_task.cpu_milli for "cpu", per_task.mem_mb for "memory"), as Kubernetes'
// HorizontalPodAutoscaler does with a utilization target; or, for "app", a metric the
// task serves itself (Prometheus text at http://<task>:<port><path>), whose value per
// ready task `target` is.
enum class AutoscaleMetric { kCpu, kMemory, kApp };
struct AppMetric {
  std::string port;  // one of the job's named ports
  std::string path = "/metrics";
  std::string name;  // the metric (its samples summed over their labels)
  bool operator==(const AppMetric&) const = default;
};
const char* autoscale_metric_name(AutoscaleMetric m);
struct AutoscaleSpec {
  int min = 1, max = 1;
  AutoscaleMetric metric = AutoscaleMetric::kCpu;
  double target = 0.7;
  AppMetric app;  // metric "app"
  double tolerance = 0.1;
  uint64_t down_window_us = 300'000'000;  // "scale_down_window"
  bool predictive = false;
  bool paused = false;  // set by `weftctl job autoscale pause`, kept with the job
  bool operator==(const AutoscaleSpec&) const = default;
};

// Batch jobs (docs/jobs.md, "Batch jobs"): tasks that end. A task that exits 0 is
// complete and not replaced; `parallelism` (the job's count) run at once until
// `completions` of them succeeded. A task that fails is retried elsewhere until
// `max_failures` failures: one more and the job fails, as it does past its `deadline`
// (from its creation; 0 = none). Kubernetes' Job: completions, parallelism,
// backoffLimit, activeDeadlineSeconds.
enum class JobKind { kService, kBatch };
struct BatchSpec {
  int completions = 1;
  int max_failures = 6;
  uint64_t deadline_us = 0;
  // Runs on capacity nobody uses now (docs/jobs.md "Opportunistic batch jobs"): the free
  // pool and other entitlements' idle room, not counted against any quota; a task there
  // is taken back when the owner needs the room, with `notice_us` to finish (SIGTERM,
  // then SIGKILL), and runs again elsewhere without counting as a failure.
  bool opportunistic = false;
  uint64_t notice_us = 30'000'000;
  bool operator==(const BatchSpec&) const = default;
};
// A periodic batch job: the control plane starts a run of it (a batch job named
// "<name>-<period's unix time>") at each time its cron schedule names (common/cron.h);
// a run still going when the next period comes is left alone ("allow", the default),
// makes the period skipped ("forbid") or is stopped for the new one ("replace").
enum class PeriodOverlap { kAllow, kForbid, kReplace };
const char* overlap_name(PeriodOverlap o);
// Bounds (issue 59): a schedule's periods are at least kMinPeriodSeconds apart (the
// leader starts runs at its tick), and at most `max_running` runs are in flight at once
// (a period due beyond that is skipped, said in the job's events).
inline constexpr int64_t kMinPeriodSeconds = 2;
inline constexpr int kDefaultMaxRunning = 10, kMaxMaxRunning = 100;
struct PeriodicSpec {
  std::string schedule;
  PeriodOverlap overlap = PeriodOverlap::kAllow;
  int max_running = kDefaultMaxRunning;
  bool operator==(const PeriodicSpec&) const = default;
};
// A periodic job's runs are named "<name>-<unix seconds>" (10 digits): its own name is
// shorter by 11.
inline constexpr size_t kMaxPeriodicNameLength = 21;
std::string period_run_name(const std::string& job, int64_t period);

struct JobSpec {
  std::string name;
  std::string entitlement;  // the entitlement's name
  int count = 1;
  JobResources per_task;
  std::string machine_type;  // "" = any
  int max_unavailable = 1;
  // An update's canary phase (docs/jobs.md, "Rollouts"): `canary` tasks get the new
  // spec first and the rollout holds until `weftctl job promote`, or until they have all
  // been ready for `auto_promote` (0: promoted by hand only), or a revert. 0: none.
  int canary = 0;
  uint64_t auto_promote_us = 0;
  PlacementPolicy placement = PlacementPolicy::kSpread;
  std::optional<TaskControllerSpec> controller;  // "task_controller"
  // "copies": "any" or "at_most_one"; when the job does not say, at_most_one for a job
  // with a TaskController (an application that coordinates its own replicas, and so
  // counts on one copy of each), any otherwise.
  JobCopies copies = JobCopies::kAny;
  bool at_most_one() const { return copies == JobCopies::kAtMostOne; }
  // Named ports (docs/services.md): name -> port on the task's machine; 0 = one the
  // control plane picks from the machine's port_range. A placement resource: no machine
  // holds two tasks that claim one fixed port. Resolved per task into task.ports.
  std::map<std::string, uint16_t> ports;
  // After a task leaves service discovery and every agent has its new answers, how long
  // its stop still waits (clients' cached answers, open connections); 0 = not at all.
  uint64_t discovery_drain_us = 0;
  // Whether the ReBalancer may move the job's tasks to improve the fleet
  // (docs/rebalancer.md); false: never (a job pinned where it is for its own reasons).
  bool rebalance = true;
  std::optional<AutoscaleSpec> autoscale;
  JobKind kind = JobKind::kService;  // "kind"
  BatchSpec batch;                   // kind batch: "batch" (count is its parallelism)
  std::optional<PeriodicSpec> periodic;
  bool is_batch() const { return kind == JobKind::kBatch; }
  // The task spec as the operator wrote it (validated; no name or owner: each task gets
  // its own id, and the control plane marks what it starts).
  nlohmann::json task = nlohmann::json::object();
};

// Names an operator gives (a job: 1-32, an entitlement: 1-64 characters) are of [A-Za-z0-9_-],
// starting with a letter or digit: safe in a shell word, a file name, a DNS label and a
// terminal, so nothing that lists or completes them can be made to run or print
// something else (docs/security.md).
bool valid_job_name(std::string_view name);
bool valid_entitlement_name(std::string_view name);

// The "autoscale" member's reader (errors name "autoscale.<field>"), given the job's
// reservation per task; and its protocol form.
Result<AutoscaleSpec> parse_autoscale_spec(const nlohmann::json& a, const JobResources& per_task,
                                           const std::map<std::string, uint16_t>& ports);
nlohmann::json to_json(const AutoscaleSpec& a);

// Parses and validates. Errors name the field: "count", "per_task.mem_mb",
// "task.resources.memory_max", "task.argv[0]".
Result<JobSpec> parse_job_spec(const nlohmann::json& j);
// The protocol form; parse_job_spec(to_json(s)) gives s back.
nlohmann::json to_json(const JobSpec& s);

std::string make_task_id(const std::string& job, int index, uint64_t seq);
// The task.run params for one task of the job, with its ports' numbers (`ports`: the
// control plane's choice for this task; empty: the job's own, 0 for any).
nlohmann::json task_run_params(const JobSpec& s, const std::string& task_id,
                               const std::map<std::string, uint16_t>& ports = {});

// The same parameters as text, made per job and not per task: the body every task of a
// job shares (its task spec serialised once, without "name" and "ports"), then each
// task's own keys spliced in: its id and its ports (the task's, or else the job's).
// task_run_text(task_run_body(s), id, ports.empty() ? s.ports : ports) parses to
// task_run_params(s, id, ports); `extra` is more keys of the same object, already
// serialised and each led by a comma (`,"holder":"s1","epoch":3`), or empty.
std::string task_run_body(const JobSpec& s);
std::string task_run_text(std::string_view body, const std::string& task_id,
                          const std::map<std::string, uint16_t>& ports,
                          std::string_view extra = {});

}  // namespace weft
