#include "agent/lifecycle.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {

std::optional<ExitRecord> parse_exit_record(const std::string& text) {
  ExitRecord r;
  bool have_inc = false;
  for (const auto& line : split(text, '\n')) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "incarnation") {
      r.incarnation = std::strtoull(v.c_str(), nullptr, 10);
      have_inc = true;
    } else if (k == "status") {
      r.status = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else if (k == "exec_errno") {
      r.exec_errno = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    } else if (k == "exec_stage") {
      r.exec_stage = v;
    } else if (k == "setup_error") {
      r.setup_error = v;
    }
  }
  if (!have_inc) return std::nullopt;
  return r;
}

static std::string exec_failure(const ExitRecord& rec, const TaskSpec& spec) {
  std::string what;
  if (rec.exec_stage == "chdir")
    what = "cannot change to working directory " + spec.cwd;
  else if (rec.exec_stage == "credentials")
    what = "cannot switch to the task's user or group";
  else
    what = "cannot execute " + spec.argv[0];
  return what + ": " + std::strerror(rec.exec_errno);
}

ExitOutcome decide_exit(const ExitFacts& f, const TaskSpec& spec) {
  ExitOutcome o;
  o.oom_killed = f.oom_killed;
  const auto& rec = f.record;
  std::optional<int> status = rec && rec->status ? rec->status : std::nullopt;
  if (!status && !rec && f.init_status) status = f.init_status;  // weft-init itself died
  // cgroup.kill took weft-init with it; when it was not our child we learn no status.
  if (!status && !rec && f.kill_sent) status = SIGKILL;
  if (status) {
    if (WIFEXITED(*status)) {
      o.exit_code = WEXITSTATUS(*status);
    } else if (WIFSIGNALED(*status)) {
      o.signal = WTERMSIG(*status);
      o.core_dumped = WCOREDUMP(*status);
    }
  }
  bool restartable = true;
  bool success = status && o.exit_code && *o.exit_code == 0 && !o.oom_killed;
  if (rec && rec->exec_errno) {
    // Restarting cannot fix a missing program or directory.
    o.reason = exec_failure(*rec, spec);
    restartable = false;
    success = false;
    o.setup = true;
  } else if (rec && !rec->setup_error.empty()) {
    o.reason = "task setup failed: " + rec->setup_error;
    restartable = false;
    success = false;
    o.setup = true;
  } else if (o.oom_killed) {
    o.reason = "killed by the kernel OOM killer (memory limit reached)";
  } else if (o.exit_code && *o.exit_code != 0) {
    o.reason = "exited with code " + std::to_string(*o.exit_code);
  } else if (o.signal) {
    o.reason = "killed by " + signal_name(*o.signal) + (o.core_dumped ? " (core dumped)" : "");
  } else if (!status) {
    o.reason = !f.prior_reason.empty() ? f.prior_reason
                                       : "weft-init ended without recording an exit status";
  }

  if (f.stop_requested)
    o.state = TaskState::kStopped;
  else
    o.state = success ? TaskState::kExited : TaskState::kFailed;

  const auto& rs = spec.restart;
  o.restart =
      !f.stop_requested && restartable &&
      (rs.policy == RestartPolicy::kAlways || (rs.policy == RestartPolicy::kOnFailure && !success));
  if (o.restart && rs.max_restarts >= 0 && f.restarts >= rs.max_restarts) {
    o.restart = false;
    o.reason += (o.reason.empty() ? "" : "; ") + std::string("restart limit reached");
  }
  if (o.restart) {
    if (f.backoff_us == 0 || f.ran_us >= static_cast<int64_t>(rs.reset_after_us)) {
      o.backoff_us = static_cast<int64_t>(rs.delay_us);
    } else {
      o.backoff_us = std::min<int64_t>(f.backoff_us * 2, static_cast<int64_t>(rs.max_delay_us));
    }
    o.state = TaskState::kBackoff;
  }
  return o;
}

}  // namespace weft::agent
