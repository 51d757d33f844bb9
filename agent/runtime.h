// Starting a task's init process inside its cgroup and namespaces.
//
// spawn_init() uses clone3(CLONE_INTO_CGROUP | CLONE_PIDFD | namespace flags), so the
// process is born inside the task's cgroup with its limits already in force. On kernels
// without clone3 or CLONE_INTO_CGROUP it falls back to clone() followed by the child
// writing itself into cgroup.procs before it executes anything. Either way the call
// returns only after the child has executed weft-init or failed to (reported through a
// close-on-exec pipe), so a bad init path or a clone error is a synchronous error.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/fs.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

struct SpawnRequest {
  std::string init_path;               // weft-init binary
  std::string cgroup_dir;              // the task's cgroup, already created with limits
  int task_dir_fd = -1;                // passed to init as fd 3
  std::vector<std::string> init_argv;  // built by build_init_argv()
  bool new_pid = true, new_mount = true, new_uts = true, new_ipc = true, new_net = false;
  bool force_fallback = false;  // tests: exercise the pre-clone3 path
};

struct Spawned {
  pid_t pid = -1;
  Fd pidfd;
  bool used_clone3 = false;
};

// Resolved identity of the task's main process.
struct Identity {
  long uid = -1, gid = -1;
  std::vector<gid_t> groups;
  bool set = false;
};
Result<Identity> resolve_identity(const std::string& user, const std::string& group);

// The identity a task runs as under the machine's policy: the spec's user, else
// `default_user`; uid 0 or gid 0 (primary or supplementary) only when `allow_root`.
// Errors name the spec field.
Result<Identity> task_identity(const std::string& user, const std::string& group,
                               const std::string& default_user, bool allow_root);

std::vector<std::string> build_init_argv(const TaskSpec& spec, const Identity& id,
                                         uint64_t incarnation);
Result<Spawned> spawn_init(const SpawnRequest& req);
// pidfd_send_signal(2): signals the process behind a pidfd (no pid reuse races).
Status signal_pidfd(int pidfd, int sig);

}  // namespace weft::agent
