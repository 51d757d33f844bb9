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

// The hostile operator (issue 32): a task of an operator's job, with the restricted
// default (a uid of its own, no host namespace, no group of the machine's), tries to act
// as the machine's administrator or to read another task's secrets through the host:
// the agent's socket, the agent's database (every task's spec, env included), another
// task's state directory and logs, that task's /proc entries and signals. Every route
// must be blocked; the task says which it tried.
TEST_F(HostileTask, AnOperatorsTaskReachesNoSocketNoAgentStateAndNoOtherTask) {
  start(false);
  if (IsSkipped()) return;
  if (!path_exists("/usr/bin/python3")) GTEST_SKIP() << "python3 is not installed";
  json victim = agent_->call("task.run", {{"name", "victim"},
                                          {"env", {{"DB_PASSWORD", "hunter2"}}},
                                          {"argv", {"sh", "-c", "echo started; exec sleep 600"}}});
  std::string vid = victim.value("id", "");
  ASSERT_FALSE(vid.empty()) << victim.dump();
  json v = agent_->wait_task(vid, [](const json& j) { return j.value("pid", 0) > 0; });
  int vpid = v.value("pid", 0);
  ASSERT_GT(vpid, 0) << v.dump();
  const std::string state = agent_->dir() + "/state";
  static const char* kScript = R"PY(
import os, socket, sys
sock, state, victim_dir, vpid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def attempt(name, fn):
    try:
        fn()
        print(name + ": REACHED", flush=True)
    except Exception as e:
        print(name + ": blocked (" + type(e).__name__ + ")", flush=True)
def connect(p):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(p)
    s.close()
def read(p):
    with open(p, "rb") as f:
        if b"hunter2" in f.read():
            raise SystemExit("the secret was read from " + p)
attempt("the agent's socket", lambda: connect(sock))
attempt("the agent's database", lambda: read(state + "/agent.db"))
attempt("the agent's tasks directory", lambda: os.listdir(state + "/tasks"))
attempt("the victim's state directory", lambda: os.listdir(victim_dir))
attempt("the victim's log", lambda: read(victim_dir + "/logs/stdout"))
attempt("the victim's environ", lambda: read("/proc/%d/environ" % vpid))
attempt("the victim's root", lambda: os.listdir("/proc/%d/root/" % vpid))
attempt("a signal to the victim", lambda: os.kill(vpid, 0))
print("done", flush=True)
)PY";
  json r = agent_->call("task.run", {{"name", "attacker"},
                                     {"argv",
                                      {"/usr/bin/python3", "-c", kScript, agent_->socket(), state,
                                       state + "/tasks/" + vid, std::to_string(vpid)}}});
  std::string aid = r.value("id", "");
  ASSERT_FALSE(aid.empty()) << r.dump();
  json t = agent_->wait_task(aid, [](const json& j) {
    std::string st = j.value("state", "");
    return st == "exited" || st == "failed";
  });
  std::string out =
      agent_->call("task.logs", {{"id", aid}, {"stream", "stdout"}}).value("data", "");
  std::string err =
      agent_->call("task.logs", {{"id", aid}, {"stream", "stderr"}}).value("data", "");
  EXPECT_EQ(t.value("exit_code", -1), 0) << out << err;
  EXPECT_NE(out.find("done"), std::string::npos) << out << err;
  int routes = 0;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find(": ") == std::string::npos) continue;
    ++routes;
    EXPECT_NE(line.find(": blocked"), std::string::npos) << line;
  }
  EXPECT_EQ(routes, 8) << out << err;
  agent_->call("task.stop", {{"id", vid}, {"grace", 1}});
  agent_->wait_state(vid, "stopped");
}

}  // namespace
}  // namespace weft::testing
