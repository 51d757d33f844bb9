// weft-agent with a session to weft-controlplane, on this machine for real: the agent
// registers, the control plane places a job on it and the agent runs it in its cgroup,
// reports keep it running, a task an operator started locally is neither reported nor
// touched, and the agent reconnects after the control plane restarts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "common/fs.h"
#include "common/rpc.h"
#include "tests/agent_harness.h"

namespace weft::testing {
namespace {

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    cp_dir_ = agent_.dir() + "/cp";
    ASSERT_TRUE(mkdir_p(cp_dir_).ok());
    ASSERT_TRUE(write_file(cp_dir_ + "/cp.toml",
                           "socket = \"" + cp_dir_ + "/cp.sock\"\nstate_dir = \"" + cp_dir_ +
                               "/state\"\nlisten = \"\"\nheartbeat_interval = \"200ms\"\n")
                    .ok());
  }
  void TearDown() override { stop_cp(SIGTERM); }
  void start_cp() {
    cp_pid_ = fork();
    if (cp_pid_ == 0) {
      int fd = open((cp_dir_ + "/cp.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(WEFT_CONTROLPLANE_BIN, "weft-controlplane", "-c", (cp_dir_ + "/cp.toml").c_str(),
            nullptr);
      _exit(127);
    }
    for (int i = 0; i < 500 && !cp("job.ls").ok(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  void stop_cp(int sig) {
    if (cp_pid_ <= 0) return;
    kill(cp_pid_, sig);
    waitpid(cp_pid_, nullptr, 0);
    cp_pid_ = -1;
  }
  Result<json> cp(const std::string& m, const json& p = json::object()) {
    TRY_ASSIGN(auto c, rpc::Client::connect(cp_dir_ + "/cp.sock"));
    return c->call(m, p, 5000);
  }
  // Waits until the control plane lists the machine as connected (and healthy enough).
  bool wait_connected() {
    for (int i = 0; i < 200; ++i) {
      auto r = cp("machine.ls");
      if (r.ok() && !(*r)["machines"].empty() && (*r)["machines"][0]["connected"] == true)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  AgentHarness agent_;
  std::string cp_dir_;
  pid_t cp_pid_ = -1;
};

TEST_F(Cluster, AgentRunsWhatTheControlPlanePlaces) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  start_cp();
  agent_.add_config("control_plane = \"unix:" + cp_dir_ + "/cp.sock\"\nmachine_id = \"testhost\"");
  agent_.start();
  if (HasFatalFailure()) return;
  ASSERT_TRUE(wait_connected()) << read_file(cp_dir_ + "/cp.log").value_or("");
  // No weft-hcs here: the machine's health is reported by hand, as HCS would.
  ASSERT_TRUE(cp("health.report", {{"machine", "testhost"}, {"verdict", "ok"}}).ok());
  // An operator's own task on the machine: the control plane must leave it alone.
  json local = agent_.call("task.run", {{"name", "local"}, {"argv", {"/bin/sleep", "600"}}});
  ASSERT_TRUE(cp("entitlement.create", {{"name", "web"}, {"quota", 1}}).ok());
  auto job = cp("job.create", {{"name", "site"},
                               {"entitlement", 1},
                               {"count", 1},
                               {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
                               {"task", {{"argv", {"/bin/sleep", "600"}}}}});
  ASSERT_TRUE(job.ok()) << job.error().str();
  // The agent runs it (for real, in its cgroup) and the control plane sees it running.
  json show;
  for (int i = 0; i < 100; ++i) {
    auto s = cp("job.show", {{"name", "site"}});
    if (s.ok() && !(*s)["tasks"].empty() && (*s)["tasks"][0]["state"] == "running") {
      show = *s;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(show.is_null()) << read_file(cp_dir_ + "/cp.log").value_or("");
  std::string task = show["tasks"][0]["id"];
  json t = agent_.wait_state(task, "running");
  EXPECT_TRUE(path_exists(agent_.task_cgroup(t["id"].get<std::string>())));
  // The local task is untouched by reconciliation.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(agent_.call("task.show", {{"id", "local"}})["state"], "running");

  // The control plane restarts; the agent reconnects and reports, nothing restarts.
  stop_cp(SIGKILL);
  start_cp();
  ASSERT_TRUE(wait_connected());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto again = cp("job.show", {{"name", "site"}});
  ASSERT_TRUE(again.ok());
  ASSERT_EQ((*again)["tasks"].size(), 1u) << again->dump();
  EXPECT_EQ((*again)["tasks"][0]["id"], task);
  EXPECT_EQ(agent_.call("task.show", {{"id", task}})["restarts"], 0);

  // Stopping the job stops the task on the machine.
  ASSERT_TRUE(cp("job.stop", {{"name", "site"}}).ok());
  agent_.wait_state(task, "stopped");
  agent_.call("task.stop", {{"id", "local"}, {"grace", 0}});
  agent_.wait_state("local", "stopped");
}

}  // namespace
}  // namespace weft::testing
