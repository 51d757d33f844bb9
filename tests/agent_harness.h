// Runs a real weft-agent for root tests: its own temp state dir, socket and cgroup root
// (a uniquely named directory under the machine's cgroup2 mount), torn down completely
// by the destructor even when a test fails: agent killed, every task cgroup killed and
// removed, temp files deleted.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "testing/process.h"

namespace weft::testing {

// A pause between polls of a condition with a deadline (never a wait that assumes a fast
// machine: docs/testing.md).
inline void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

using json = nlohmann::json;

// The cgroup2 root's cgroup.subtree_control is one per machine, and agents under test
// enable their controllers there (as systemd's Delegate= would). Tests run side by side
// (ctest -j), so none may put the file back while another's agents run: each holds a
// lease while it has agents; the first lease records the file, the last one released
// puts it back. Holders are processes: a lease of a process that died (a sanitizer
// abort, SIGKILL) counts no more, and the next lease taken or released restores what it
// recorded if no live holder is left. The bookkeeping is under /run/weft-test-cgroup2/
// (removed with the last lease), serialised by flock on the cgroup2 mount itself.
class SubtreeControlLease {
 public:
  explicit SubtreeControlLease(std::string mount);
  ~SubtreeControlLease();
  SubtreeControlLease(const SubtreeControlLease&) = delete;
  SubtreeControlLease& operator=(const SubtreeControlLease&) = delete;

 private:
  std::string mount_, holder_;
};

// A process that is alive and not a zombie nobody reaped (a harness's owner, a lease's
// holder).
bool process_alive(pid_t pid);

// Empty when root tests can run here; otherwise the reason to skip.
std::string root_test_skip_reason();

class AgentHarness {
 public:
  // root_tasks: tasks run as the agent's user (root) by default, as they did before
  // the non-root default; false keeps the shipped policy (nobody, root refused).
  explicit AgentHarness(bool root_tasks = true);
  ~AgentHarness();

  // Starts weft-agent and waits until its socket answers. With crash_at, the agent is
  // started with WEFT_AGENT_CRASH_AT set and may die later at that point; with fail_at,
  // WEFT_AGENT_FAIL_AT (a start fails there once: "point" or "point#N", its Nth time).
  void start(const std::string& crash_at = "", const std::string& fail_at = "");
  // More top-level agent.toml lines (before start).
  void add_config(const std::string& lines);
  // Lines at the end of agent.toml (tables such as [images]).
  void append_config(const std::string& lines);
  // The agent's state directory on a tmpfs of `bytes` (before start): a small disk to
  // fill. Unmounted when the harness goes.
  void state_on_tmpfs(uint64_t bytes);
  void kill9();
  void terminate();  // SIGTERM and wait
  // Waits for an agent started with crash_at to kill itself; true if it did.
  bool wait_dead(int timeout_ms = 10000);
  pid_t pid() const { return pid_; }

  Result<json> try_call(const std::string& method, const json& params);
  json call(const std::string& method, const json& params);  // ADD_FAILURE on error

  // Polls task.show until pred holds or timeout; returns the last reply.
  json wait_task(const std::string& id, const std::function<bool(const json&)>& pred,
                 int timeout_ms = 15000);
  json wait_state(const std::string& id, const std::string& state, int timeout_ms = 15000);

  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& cgroup_root() const { return cgroup_root_; }
  std::string task_cgroup(const std::string& id) const { return cgroup_root_ + "/tasks/" + id; }
  // The task cgroups under the agent's tree, but the sandboxes' (made ahead for the
  // next tasks, agent/sandbox_pool.h) while the agent runs.
  std::vector<std::string> task_cgroups() const;
  // The ids of the agent's ready sandboxes (agent.info), empty when it is not running.
  std::vector<std::string> sandbox_ids() const;

 private:
  std::string dir_, socket_, cgroup_root_, config_, tmpfs_;
  std::unique_ptr<SubtreeControlLease> lease_;
  pid_t pid_ = -1;
};

// Kills every process in the cgroup subtree and removes it, leaves first.
void destroy_cgroup_tree(const std::string& dir);

}  // namespace weft::testing
