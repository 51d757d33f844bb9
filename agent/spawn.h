// Starting a task's init process inside its cgroup and namespaces, and signalling it.
//
// spawn_init() starts weft-init the way posix_spawn starts a program, but born in the
// task's cgroup: clone3(CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP | CLONE_PIDFD |
// namespace flags) with the child on a small stack of its own (x86-64; elsewhere a
// fork-style clone3). The agent's page tables are not copied (a fork-style clone of the
// agent cost ~1.4 ms of every start), and nothing writes cgroup.procs, whose
// migration lock waits for an RCU grace period (~15 ms on an idle machine). kClone3
// (fork-style clone3 into the cgroup) and kFork (clone, then the child writes
// cgroup.procs: kernels without clone3) remain for tests and old kernels. Either way
// the call returns only after the child has executed weft-init or failed to (reported
// through a close-on-exec pipe), so a bad init path or a clone error is a synchronous
// error.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/fs.h"
#include "common/result.h"

namespace weft::agent {

struct SpawnRequest {
  std::string init_path;               // weft-init binary
  std::string cgroup_dir;              // the task's cgroup, already created with limits
  int task_dir_fd = -1;                // passed to init as fd 3
  std::vector<std::string> init_argv;  // agent/init/argv.h
  bool new_pid = true, new_mount = true, new_uts = true, new_ipc = true, new_net = false;
  enum class Mode { kVfork, kClone3, kFork };
  Mode mode = Mode::kVfork;
  int files_fd = -1;  // the spec's files' contents, passed to init as fd 4
  // A network namespace made ahead of time (netns_pool.h) the child enters instead of
  // making one (new_net is then false), or -1.
  int netns_fd = -1;
  // The child's stdin, stdout and stderr (-1: /dev/null): a command joined to a task
  // for `weftctl task exec` (a terminal or pipes).
  int stdio[3] = {-1, -1, -1};
};

struct Spawned {
  pid_t pid = -1;
  Fd pidfd;
  SpawnRequest::Mode used = SpawnRequest::Mode::kVfork;
};

// The task's weft-init started as the request says (see above).
Result<Spawned> spawn_init(const SpawnRequest& req);
// The request for weft-init --join-pid (a command joined to a running task: readiness
// and liveness exec checks, `task exec`): no namespace of its own, the task's pidfd as
// fd 3, in `cgroup_dir` beneath the task's.
SpawnRequest join_request(std::string init_path, std::string cgroup_dir, int task_pidfd,
                          std::vector<std::string> init_argv);
// pidfd_send_signal(2): signals the process behind a pidfd (no pid reuse races).
Status signal_pidfd(int pidfd, int sig);

}  // namespace weft::agent
