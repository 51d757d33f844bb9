// Sandboxes made ahead of time: weft-init already running in a task's cgroup and
// namespaces before any task asked for them (Twine's and the issue-18 design's "warm"
// start). Taking one, a task's start skips the agent's clone with namespaces and
// weft-init's exec and static start (about 1.4 ms of the ~2 ms in the agent here): the
// agent writes the task's limits into the sandbox's cgroup and hands weft-init its argv
// and descriptors (agent/init/handoff.h); weft-init then sets the task up as usual.
//
// A sandbox's cgroup is named with the id the task that takes it will have (cgroup v2
// cannot rename a cgroup, and a process cannot move into one without waiting for an RCU
// grace period). A sandbox holds nothing of any task: an agent that dies leaves only a
// weft-init waiting on a closed socket, which exits, and a cgroup no record names, which
// the next agent removes like any unknown task cgroup.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/fs.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

// The namespaces of its own a task has; a sandbox serves only tasks with the same set.
enum NsBit : unsigned { kNsPid = 1, kNsMount = 2, kNsUts = 4, kNsIpc = 8, kNsNet = 16 };
unsigned ns_bits(const TaskSpec& spec);

struct Sandbox {
  std::string id;  // its cgroup's name, and the id of the task that takes it
  unsigned ns = 0;
  pid_t pid = -1;
  Fd pidfd;
  Fd sock;                 // the agent's end of the hand-off socket
  std::string init_stamp;  // file_stamp() of the weft-init it runs
};

// Identifies the file at `path` as it is now (device, inode, size, modification time),
// or "" when it cannot be read: a sandbox whose weft-init was replaced since is not used.
std::string file_stamp(const std::string& path);

// Starts `weft-init --await-task` in `cgroup_dir` (made by the caller, the cgroup of
// task `id`) with the namespaces `ns`.
Result<Sandbox> start_sandbox(const std::string& init_path, const std::string& id,
                              const std::string& cgroup_dir, unsigned ns);
// Hands the task to the sandbox: `init_argv` (build_init_argv()), the task directory and
// the files' memfd (or -1). Never blocks: an error when the sandbox is gone or the
// message does not fit in the socket at once, and the sandbox must then be ended.
Status hand_off(const Sandbox& s, const std::vector<std::string>& init_argv, int task_dir_fd,
                int files_fd);
// The hand-off's bytes (agent/init/handoff.h): the header, then the argv's strings. Empty
// when the argv is empty or too large to hand off.
std::string handoff_message(const std::vector<std::string>& init_argv, uint32_t nfds);
// Kills the sandbox's weft-init and reaps it; the caller removes its cgroup.
void end_sandbox(Sandbox& s);

}  // namespace weft::agent
