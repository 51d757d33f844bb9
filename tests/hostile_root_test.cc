// The hostile-task suite (issue 11): a task is untrusted code. escape_probe runs as a
// weft task and tries the known ways out of a container (inherited descriptors,
// /proc/1, /proc/self/exe, mounts, namespaces, ptrace, device nodes, /proc/sys,
// cgroup files, BPF, perf, keyrings, file handles, a chroot breakout) in the shapes a
// task can take: in a rootfs as the default user and as root, and on the host root
// with a mount namespace. Every route must report "blocked".
#include <gtest/gtest.h>
#include <unistd.h>
#include <cstdlib>

#include <iostream>
#include <sstream>

#include "common/fs.h"
#include "tests/agent_harness.h"

namespace weft::testing {
namespace {

class HostileTask : public ::testing::Test {
 protected:
  void start(bool allow_root) {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    if (!path_exists("/bin/busybox")) {
      if (std::getenv("WEFT_REQUIRE_ROOT_TESTS")) ADD_FAILURE() << "busybox-static is missing";
      GTEST_SKIP() << "busybox-static is not installed (scripts/setup.sh installs it)";
    }
    agent_ = std::make_unique<AgentHarness>(/*root_tasks=*/false);
    if (allow_root) agent_->add_config("allow_root_tasks = true");
    agent_->start();
    rootfs_ = agent_->dir() + "/rootfs";
    ASSERT_TRUE(mkdir_p(rootfs_ + "/bin").ok());
    ASSERT_TRUE(mkdir_p(rootfs_ + "/mnt").ok());
    ASSERT_EQ(system(("cp /bin/busybox " + rootfs_ + "/bin/busybox").c_str()), 0);
    ASSERT_EQ(system(("cp " ESCAPE_PROBE_BIN " " + rootfs_ + "/bin/escape_probe").c_str()), 0);
  }
  void TearDown() override { agent_.reset(); }

  // Runs the probe and returns its output; every route must say blocked.
  std::string probe(json spec) {
    json r = agent_->call("task.run", spec);
    std::string id = r.value("id", "");
    EXPECT_FALSE(id.empty()) << r.dump();
    if (id.empty()) return "";
    json t = agent_->wait_task(id, [](const json& j) {
      std::string s = j.value("state", "");
      return s == "exited" || s == "failed" || s == "stopped";
    });
    std::string out =
        agent_->call("task.logs", {{"id", id}, {"stream", "stdout"}}).value("data", "");
    std::string err =
        agent_->call("task.logs", {{"id", id}, {"stream", "stderr"}}).value("data", "");
    EXPECT_NE(out.find(" done escaped=0"), std::string::npos) << out << err;
    EXPECT_EQ(t.value("exit_code", -1), 0) << out << err;
    std::istringstream lines(out);
    std::string line;
    int routes = 0;
    while (std::getline(lines, line)) {
      if (line.find(": ") == std::string::npos) continue;
      ++routes;
      EXPECT_NE(line.find(": blocked"), std::string::npos) << line;
    }
    EXPECT_GE(routes, 20) << out << err;
    if (std::getenv("WEFT_SHOW_PROBE")) std::cerr << out << err;
    return out;
  }

  std::unique_ptr<AgentHarness> agent_;
  std::string rootfs_;
};

TEST_F(HostileTask, RootfsTaskAsDefaultUser) {
  start(false);
  if (IsSkipped()) return;
  std::string out = probe({{"name", "probe"},
                           {"rootfs", rootfs_},
                           {"argv", {"/bin/escape_probe", agent_->dir() + "/state"}}});
  // A uid of its own (agent.toml task_uids), not one shared with the host or other tasks.
  auto at = out.find("uid=");
  ASSERT_NE(at, std::string::npos) << out;
  long uid = std::strtol(out.c_str() + at + 4, nullptr, 10);
  EXPECT_GE(uid, 3000000) << "not a uid of the task's own: " << out;
  EXPECT_LE(uid, 3065535) << out;
}

TEST_F(HostileTask, RootfsTaskAsRoot) {
  start(true);
  if (IsSkipped()) return;
  std::string out = probe({{"name", "probe"},
                           {"user", "root"},
                           {"rootfs", rootfs_},
                           {"argv", {"/bin/escape_probe", agent_->dir() + "/state"}}});
  EXPECT_NE(out.find("uid=0 "), std::string::npos) << out;
}

TEST_F(HostileTask, HostRootTaskWithMountNamespace) {
  start(false);
  if (IsSkipped()) return;
  probe({{"name", "probe"}, {"argv", {ESCAPE_PROBE_BIN}}});
}

// The policy itself: root is refused unless the machine allows it, and so is a task
// that asks to run without the seccomp filter.
TEST_F(HostileTask, RootAndUnconfinedNeedTheOperatorsConsent) {
  start(false);
  if (IsSkipped()) return;
  auto root = agent_->try_call("task.run", {{"name", "r"}, {"user", "root"}, {"argv", {"true"}}});
  ASSERT_FALSE(root.ok());
  EXPECT_NE(root.error().str().find("allow_root_tasks"), std::string::npos) << root.error().str();
  auto gid0 = agent_->try_call(
      "task.run", {{"name", "g"}, {"user", "nobody"}, {"group", "0"}, {"argv", {"true"}}});
  ASSERT_FALSE(gid0.ok());
  auto unconfined =
      agent_->try_call("task.run", {{"name", "u"}, {"seccomp", "unconfined"}, {"argv", {"true"}}});
  ASSERT_FALSE(unconfined.ok());
  EXPECT_NE(unconfined.error().str().find("allow_unconfined_tasks"), std::string::npos);
  EXPECT_TRUE(agent_->call("task.ls", json::object()).value("tasks", json::array()).empty());
}

}  // namespace
}  // namespace weft::testing
