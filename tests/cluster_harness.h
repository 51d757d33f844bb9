// A whole weft cluster on one host for root tests and benchmarks: weft-controlplane in
// a "hub" network namespace that holds a bridge, and N machines, each a network
// namespace with a veth to that bridge, its own cgroup subtree, and its own weft-agent,
// weft-sidekick and weft-hcs talking TCP to the control plane. Killing a machine kills
// its daemons and its tasks, as a power loss would. The destructor removes everything
// (processes, cgroups, namespaces, files) even when a test fails.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/result.h"
#include "tests/agent_harness.h"

namespace weft::testing {

using json = nlohmann::json;

struct ClusterOptions {
  int machines = 4;
  std::string heartbeat = "500ms";  // the control plane's heartbeat interval
  int missed_heartbeats = 3;
  std::string hcs_interval = "1s";
  // Every machine session over mutual TLS (certificates from scripts/weft-pki), as a
  // fleet runs; false: plaintext TCP with insecure_listen / insecure_control_plane.
  bool tls = true;
  // The control plane's prepare_timeout ("" = its default).
  std::string prepare_timeout;
  // The ReBalancer's loop runs (every second); off by default: no task moves that a
  // test did not ask for.
  bool rebalance = false;
  // Machine index -> a host profile ("dev" or "web") its weft-sidekick does not have.
  std::map<int, std::string> lacks_profile;
  // Non-empty ("16m"): the control plane's and every agent's state_dir each on a tmpfs
  // of this size, which a test may fill (issue 61's full disk); unmounted with the rest.
  std::string state_fs_size;
  // The control plane and every agent run under libfaketime (Debian's libfaketime), their
  // wall clocks offset by step_wall_clock and their monotonic clocks left alone.
  bool faked_wall_clocks = false;
  // The control plane's and every agent's state_dir each behind a FUSE pass-through whose
  // fsync waits as set_disk_delay says (weft-test-slowfs; above state_fs_size's tmpfs
  // when both are set): a slow disk.
  bool slow_state_fs = false;
  // More controlplane.toml lines (machine_lease = "10s", say).
  std::string cp_extra;
};

class ClusterHarness {
 public:
  explicit ClusterHarness(ClusterOptions opts = {});
  ~ClusterHarness();
  ClusterHarness(const ClusterHarness&) = delete;
  ClusterHarness& operator=(const ClusterHarness&) = delete;

  // Namespaces, bridge and cgroups; false (with a test failure) if they cannot be made.
  bool setup();
  void start_cp();
  void kill_cp(int sig = SIGKILL);
  void start_machine(int i);
  // Power loss: SIGKILL of the machine's daemons and every task in its cgroup subtree.
  void kill_machine(int i);
  void stop_machine(int i);  // SIGTERM to the daemons (tasks keep running)
  bool machine_running(int i) const;
  // The daemons that ended on their own (not stopped or killed by the test): "the control
  // plane (exit 1)", "m2's weft-agent (signal 6)"; none when all that were started run.
  std::vector<std::string> ended_on_their_own();
  // A signal to machine i's weft-sidekick (SIGSTOP: it applies nothing until SIGCONT).
  void signal_sidekick(int i, int sig);

  // Operator calls on the control plane's Unix socket, and calls to a machine's agent.
  Result<json> cp(const std::string& method, const json& params = json::object());
  Result<json> agent(int i, const std::string& method, const json& params = json::object());
  // Polls until pred(reply of cp(method, params)) holds; the last reply, or null on timeout.
  json wait_cp(const std::string& method, const json& params,
               const std::function<bool(const json&)>& pred, int timeout_ms = 30000);
  // Every machine registered, healthy and connected (agent, sidekick and hcs).
  bool wait_all_ready(int timeout_ms = 60000);
  // The whole cluster as most tests begin: setup(), the control plane and every machine
  // started, all of them ready; a failure says what the control plane lists, and the logs.
  ::testing::AssertionResult start_all();

  int machines() const { return static_cast<int>(machines_.size()); }
  std::string machine_id(int i) const { return "m" + std::to_string(i); }
  std::string machine_address(int i) const { return "10.77.0." + std::to_string(10 + i); }
  // The network namespace machine i's daemons and tasks run in; its agent answers DNS
  // on 127.0.0.1:8600 there (dns_listen), and has a bridge "weft0" for bridge tasks
  // (10.89.0.0/24, which may reach port 18083 of their machine).
  std::string netns(int i) const { return machines_.at(static_cast<size_t>(i)).netns; }
  // A command run in machine i's network namespace (`ip netns exec`); its output.
  Result<std::string> run_in(int i, const std::string& command) const;
  // A program started in machine i's network namespace, its output to `out`; stop it
  // with stop_in (its output is then complete). It dies with the test process.
  pid_t start_in(int i, const std::vector<std::string>& argv, const std::string& out);
  static void stop_in(pid_t pid, int sig = SIGTERM);
  // A partition (issue 61): packets between machine i and the control plane dropped by a
  // packet filter in its namespace: both ways, only what the control plane sends (the
  // machine's calls arrive, their answers never do), or only what the machine sends;
  // heal_link removes it. The filter goes with the namespace whatever a test does.
  enum class Cut { kBoth, kAnswers, kCalls };
  Status cut_off(int i, Cut how);
  Status heal_link(int i);
  // With faked_wall_clocks: the wall clock of the control plane (who = -1) or of machine
  // `who`'s agent set `offset_s` seconds from the host's, at once (a step).
  Status step_wall_clock(int who, int64_t offset_s);
  // More controlplane.toml lines, for the next start_cp() (replacing earlier ones).
  void set_cp_extra(const std::string& lines);
  int machine_index(const std::string& id) const;  // -1 if not one of ours
  // A task's cgroup on machine i (the agent's layout: <cgroup_root>/tasks/<id>).
  std::string task_cgroup(int i, const std::string& id) const {
    return machines_.at(static_cast<size_t>(i)).cgroup_root + "/tasks/" + id;
  }
  std::string logs() const;  // every daemon's log, for failure messages
  // The control plane's and machine i's agent's state directories.
  std::string cp_state_dir() const { return dir_ + "/cp"; }
  std::string agent_state_dir(int i) const {
    return machines_.at(static_cast<size_t>(i)).dir + "/agent";
  }
  // With state_fs_size: the control plane's (who = -1) or machine `who`'s agent's state
  // filesystem filled (a file "filler" written until ENOSPC), and freed again.
  Status fill_state_fs(int who);
  Status free_state_fs(int who);
  // With slow_state_fs: every fsync and fdatasync on the control plane's (who = -1) or
  // machine `who`'s agent's state filesystem waits `ms` first (0: none), from now on.
  Status set_disk_delay(int who, int ms);
  // Whether the control plane's (who = -1) or machine `who`'s agent's log says `text`:
  // log_has fails (the log in its message) when it does not, log_lacks when it does,
  // both when the log cannot be read.
  ::testing::AssertionResult log_has(int who, const std::string& text) const;
  ::testing::AssertionResult log_lacks(int who, const std::string& text) const;
  // Machine i's agent log (every agent it ran, appended).
  std::string agent_log(int i) const {
    return machines_.at(static_cast<size_t>(i)).dir + "/agent.log";
  }
  const std::string& dir() const { return dir_; }
  const ClusterOptions& options() const { return opts_; }
  pid_t cp_pid() const { return cp_; }  // -1 when it is not running
  std::string cp_socket() const { return dir_ + "/cp.sock"; }
  // The network namespace the control plane runs in (its loopback: web_listen).
  const std::string& hub_netns() const { return hub_; }

 private:
  struct Machine {
    std::string dir, netns, cgroup_root;
    pid_t agent = -1, sidekick = -1, hcs = -1;
  };
  pid_t spawn(const std::string& netns, const char* bin, const std::string& conf,
              const std::string& log, const std::string& clock_file = "");
  std::string clock_file(int who) const;  // faked_wall_clocks' offset file
  void reap(pid_t& pid, int sig);
  void sweep_stale();
  void sweep_faketime_shm();
  // slow_state_fs: weft-test-slowfs serving `dir` from `dir`.disk (a tmpfs of
  // state_fs_size when set), its delay read from `delay_file`; false with a failure.
  bool mount_state_fs(const std::string& dir, const std::string& delay_file);
  std::vector<pid_t> slowfs_;  // the FUSE servers, stopped after their unmount

  ClusterOptions opts_;
  std::string id_, dir_, hub_, cgroup_parent_, mount_;
  std::unique_ptr<SubtreeControlLease> lease_;
  std::vector<Machine> machines_;
  std::vector<std::string> netns_made_;
  std::vector<std::string> mounts_made_;  // state_fs_size's, unmounted last first
  pid_t cp_ = -1;
  bool cgroup_made_ = false;
  std::string cp_conf_;  // controlplane.toml without set_cp_extra's lines
};

}  // namespace weft::testing
