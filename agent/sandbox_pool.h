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

#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/cgroup.h"
#include "agent/task_dirs.h"
#include "common/event.h"
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
// Hands the task to the sandbox: `init_argv` (agent/init/argv.h), the task directory and
// the files' memfd (or -1). Never blocks: an error when the sandbox is gone or the
// message does not fit in the socket at once, and the sandbox must then be ended.
Status hand_off(const Sandbox& s, const std::vector<std::string>& init_argv, int task_dir_fd,
                int files_fd);
// The hand-off's bytes (agent/init/handoff.h): the header, then the argv's strings. Empty
// when the argv is empty or too large to hand off.
std::string handoff_message(const std::vector<std::string>& init_argv, uint32_t nfds);
// Kills the sandbox's weft-init and reaps it; the caller removes its cgroup.
void end_sandbox(Sandbox& s);

// The sandboxes kept ready (agent.toml sandbox_pool), for the namespaces the last task
// asked for. New ones are made on the loop only when it has nothing else to do, and not
// until a few milliseconds after one was taken (more starts may follow, and a new
// sandbox's clone takes the kernel locks the task just handed over still needs). The
// first failure to make one stops the pool for good (logged once; tasks then start the
// usual way).
class SandboxPool {
 public:
  struct Config {
    size_t size = 0;        // sandboxes kept ready (0: none)
    std::string init_path;  // weft-init
  };
  // `id_in_use`: whether a task has that id (a sandbox's id is one no task has). A
  // sandbox's task directory is made ahead too, in `dirs`.
  SandboxPool(EventLoop& loop, CgroupTree& cgroups, Config cfg, TaskDirs& dirs,
              std::function<bool(const std::string&)> id_in_use);
  // Sandboxes hold no task: a clean stop leaves none behind (a crash leaves them to the
  // next agent, which removes their cgroups as unknown ones).
  ~SandboxPool();
  SandboxPool(const SandboxPool&) = delete;
  SandboxPool& operator=(const SandboxPool&) = delete;

  // Begins filling the pool with sandboxes for tasks of the default namespaces.
  void start();
  // A ready sandbox for `spec`, or none (image, package and bridge tasks never take one:
  // they start after their layers are here, or after the bridge is plugged in).
  std::optional<Sandbox> take(const TaskSpec& spec);
  // Ends a sandbox and removes its cgroup, and its directory unless a task took its id
  // (`remove_dir` false: the task's start goes on, or cleans up, without it).
  void discard(Sandbox& s, bool remove_dir = false);

  std::vector<std::string> ids() const;
  size_t ready() const { return ready_.size(); }
  size_t size() const { return cfg_.size; }
  // Why the pool stopped (making one failed), or empty.
  const std::string& failure() const { return failure_; }

 private:
  void arm_refill(uint64_t after_us);
  void refill();

  EventLoop& loop_;
  CgroupTree& cgroups_;
  const Config cfg_;
  TaskDirs& dirs_;
  std::function<bool(const std::string&)> id_in_use_;
  std::deque<Sandbox> ready_;  // oldest first
  unsigned ns_ = 0;            // what new ones are made for: the last a task asked for
  Source refill_;
  std::string failure_;
};

}  // namespace weft::agent
