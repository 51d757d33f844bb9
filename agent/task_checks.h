// A task's readiness and liveness checks (docs/jobs.md, "Readiness" and "Liveness"): the
// checks start when the task runs (after each check's initial delay) and stop when it
// stops running. A change of readiness is reported at once (`readiness_changed`); a task
// that failed its liveness check failure_threshold times in a row is not live: a
// control plane's task is reported to it (`unhealthy`: it restarts the task, its
// TaskController asked first), a local task is killed and its restart policy decides.
//
// The checks' state is the task's (Task::check*, Task::live); this holds their
// behaviour: timers, runs, thresholds. An exec check runs as the task's identity in a
// cgroup of its own (CgroupTree::check_dir), ended with it. Not thread-safe: the loop's.
#pragma once

#include <functional>
#include <string>

#include "agent/cgroup.h"
#include "agent/readiness.h"
#include "agent/task.h"
#include "common/event.h"
#include "common/http_client.h"

namespace weft::agent {

class TaskChecks {
 public:
  struct Hooks {
    // The task by id, or null when it is gone.
    std::function<Task*(const std::string& id)> find;
    // Who an exec check runs as: the task's identity.
    std::function<Result<Identity>(Task& t)> identity;
    // The task's readiness changed (reported to the control plane for its tasks).
    std::function<void(Task& t)> readiness_changed;
    // A control plane's task is not live: false when there is no control plane to tell.
    std::function<bool(Task& t, const std::string& why)> unhealthy;
  };
  TaskChecks(EventLoop& loop, HttpClient& http, Reaper& reaper, CgroupTree& cgroups,
             std::string init_path, Hooks hooks)
      : loop_(loop),
        http_(http),
        reaper_(reaper),
        cgroups_(cgroups),
        init_path_(std::move(init_path)),
        hooks_(std::move(hooks)) {}

  // The task runs: its checks start (a task without a readiness check is ready now).
  void start(Task& t);
  // It stopped running: every check ends, and it is not ready.
  void stop(Task& t);

 private:
  void schedule_check(Task& t, uint64_t after_us);
  void run_check(const std::string& id);
  void on_check(const std::string& id, bool passed, std::string detail);
  void set_ready(Task& t, bool ready);
  void start_liveness(Task& t);
  void stop_liveness(Task& t);
  void run_liveness(const std::string& id);
  void on_liveness(const std::string& id, bool passed, std::string detail);
  void not_live(Task& t);
  // What a check of `check` needs to enter the task.
  Result<CheckTarget> target(Task& t, const ReadinessCheck& check, bool liveness);

  EventLoop& loop_;
  HttpClient& http_;
  Reaper& reaper_;
  CgroupTree& cgroups_;
  std::string init_path_;
  Hooks hooks_;
};

}  // namespace weft::agent
