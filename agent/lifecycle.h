// Pure decisions of the task lifecycle: what an ended incarnation means (exit code,
// signal, OOM, reason, final state) and whether and when to restart it. No I/O, so
// every case is unit-tested on plain structs (lifecycle_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/task_spec.h"
#include "common/task_state.h"

namespace weft::agent {

// <task dir>/exit as written by weft-init when the incarnation ends.
struct ExitRecord {
  uint64_t incarnation = 0;
  std::optional<int> status;  // raw wait status of the main process
  int exec_errno = 0;         // the main program could not be started
  std::string exec_stage;     // where that failed: "exec", "chdir", "credentials"
  std::string setup_error;    // weft-init could not set up the task's environment
};
std::optional<ExitRecord> parse_exit_record(const std::string& text);

// What the agent knows when an incarnation has ended.
struct ExitFacts {
  std::optional<ExitRecord> record;  // only one matching the incarnation
  std::optional<int> init_status;    // weft-init's own wait status, when it was our child
  bool kill_sent = false;            // this agent wrote cgroup.kill for it
  bool oom_killed = false;           // memory.events oom_kill > 0 for its cgroup
  bool stop_requested = false;
  std::string prior_reason;  // set by recovery when nothing else is known
  int64_t restarts = 0;      // restarts so far
  int64_t backoff_us = 0;    // the previous backoff, 0 if none
  int64_t ran_us = 0;        // how long the incarnation ran
};

struct ExitOutcome {
  std::optional<int> exit_code, signal;
  bool core_dumped = false;
  bool oom_killed = false;
  TaskState state = TaskState::kExited;  // exited, failed, stopped, or backoff (a restart follows)
  std::string reason;
  bool setup = false;  // it failed before its program ran (setup, or its exec)
  bool restart = false;
  int64_t backoff_us = 0;  // delay before the restart
};

ExitOutcome decide_exit(const ExitFacts& facts, const TaskSpec& spec);

}  // namespace weft::agent
