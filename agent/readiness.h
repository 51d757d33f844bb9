// Readiness checks (common/task_spec.h ReadinessCheck): one run of a task's check on the
// agent's loop, asynchronous and bounded by the check's timeout.
//
// - tcp: connect to 127.0.0.1:port; passes when the connection is accepted.
// - http: GET http://127.0.0.1:port<path> (libcurl, common/http_client.h); 2xx or 3xx
//   passes.
// - exec: the command runs inside the task (weft-init --join-pid: the task's namespaces,
//   root, cgroup, credentials, capabilities and seccomp filter); exit status 0 passes.
// For a task with a network namespace of its own, the socket is created in that
// namespace (a short-lived thread enters it; the loop's thread never changes namespace).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "agent/spawn.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/http_client.h"
#include "common/task_spec.h"

namespace weft::agent {

// What a check needs to know of the task it checks.
struct CheckTarget {
  pid_t pid = -1;            // the task's weft-init (host pid)
  int pidfd = -1;            // its pidfd (borrowed)
  bool own_network = false;  // a network namespace of its own
  // exec checks: how to start weft-init in the task's cgroup, and its arguments.
  std::string init_path;
  std::string cgroup_dir;
  std::vector<std::string> join_argv;  // init_argv(..., InitJoin{pid})
};

// The outcome of one run: passed or not, and why not ("connection refused", "HTTP 503",
// "exit status 1", "timed out after 1s").
using CheckDone = std::function<void(bool passed, std::string detail)>;

// A check in progress; destroying it abandons the check (a command is killed and
// reaped without blocking the loop) and its callback never runs.
class CheckRun {
 public:
  virtual ~CheckRun() = default;
};

// A check's state on one task (its liveness check's; readiness keeps its own on the
// task): its outcomes in a row, why the last failed, the next run and the run under way.
struct Probe {
  uint64_t passes = 0, failures = 0;
  std::string detail;
  Source timer;
  std::unique_ptr<CheckRun> run;
};

// Reaps exec checks abandoned while their command still ran (killed, not yet exited),
// from the loop; owned by the agent for as long as its loop.
class Reaper {
 public:
  explicit Reaper(EventLoop& loop) : loop_(loop) {}
  // Takes a killed child's pidfd: reaped once it exits.
  void adopt(Fd pidfd);
  size_t pending() const { return orphans_.size(); }

 private:
  EventLoop& loop_;
  std::map<int, std::pair<Fd, Source>> orphans_;
};

std::unique_ptr<CheckRun> start_check(EventLoop& loop, HttpClient& http, Reaper& reaper,
                                      const ReadinessCheck& c, const CheckTarget& target,
                                      CheckDone done);

// A socket created in the network namespace of the process behind `pidfd` (-1: this
// process's namespace). -1 with errno on failure.
int socket_in_netns(int pidfd, int family, int type, int protocol);

}  // namespace weft::agent
