// weft-hcs as a process: verdicts with hysteresis through the API, state across a
// restart, and the kernel log read from the real /dev/kmsg.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "common/rpc.h"
#include "tests/agent_harness.h"

namespace weft::testing {
namespace {

class Hcs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-hcs-test-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
  }
  void TearDown() override {
    stop();
    (void)remove_tree(dir_);
  }
  void start(const std::string& extra) {
    std::string conf = "socket = \"" + dir_ + "/hcs.sock\"\nstate_dir = \"" + dir_ +
                       "/state\"\ninterval = \"200ms\"\n" + extra;
    ASSERT_TRUE(write_file(dir_ + "/hcs.toml", conf).ok());
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open((dir_ + "/hcs.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(WEFT_HCS_BIN, "weft-hcs", "-c", (dir_ + "/hcs.toml").c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 300; ++i) {
      auto r = call("health.verdict");
      if (r.ok() && (*r)["published"] == true) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "weft-hcs did not publish a verdict: " << read_file(dir_ + "/hcs.log").value_or("");
  }
  void stop() {
    if (pid_ < 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  Result<json> call(const std::string& m, const json& p = json::object()) {
    TRY_ASSIGN(auto c, rpc::Client::connect(dir_ + "/hcs.sock"));
    return c->call(m, p, 5000);
  }
  json probe(const std::string& name) {
    auto r = call("health.probes");
    if (r.ok())
      for (const auto& p : (*r)["probes"])
        if (p["probe"] == name) return p;
    return json();
  }
  json wait_probe(const std::string& name, const std::string& state) {
    json p;
    for (int i = 0; i < 100; ++i) {
      p = probe(name);
      if (p.value("state", "") == state) return p;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << name << " never reached " << state << ": " << p.dump();
    return p;
  }
  std::string dir_;
  pid_t pid_ = -1;
};

TEST_F(Hcs, ExecProbeVerdictHysteresisAndRestart) {
  std::string flag = dir_ + "/broken";
  start(
      "kmsg = false\n[hysteresis]\nfail_after = 3\nrecover_after = 2\nhold_down = \"0s\"\n"
      "[[exec]]\nname = \"flag\"\ncommand = [\"sh\", \"-c\", \"test ! -e " +
      flag + " || { echo broken; exit 2; }\"]\n");
  wait_probe("exec:flag", "ok");
  ASSERT_TRUE(write_file(flag, "x").ok());
  json p = wait_probe("exec:flag", "failed");
  EXPECT_EQ(p["detail"], "broken");
  auto v = call("health.verdict");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((*v)["verdict"], "failed");
  EXPECT_EQ((*v)["problems"][0]["probe"], "exec:flag");
  // A restart keeps the state: still failed before a good run has been seen.
  stop();
  start(
      "kmsg = false\n[hysteresis]\nfail_after = 3\nrecover_after = 2\nhold_down = \"0s\"\n"
      "[[exec]]\nname = \"flag\"\ncommand = [\"sh\", \"-c\", \"test ! -e " +
      flag + " || { echo broken; exit 2; }\"]\n");
  EXPECT_EQ(probe("exec:flag")["state"], "failed");
  ::unlink(flag.c_str());
  wait_probe("exec:flag", "ok");
  auto h = call("health.history");
  ASSERT_TRUE(h.ok());
  bool saw_fail = false;
  for (const auto& t : (*h)["transitions"])
    saw_fail |= t["probe"] == "exec:flag" && t["to"] == "failed";
  EXPECT_TRUE(saw_fail) << h->dump();
}

TEST_F(Hcs, KernelLogFromDevKmsg) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  start("[[disk]]\npath = \"/\"\nmin_free_pct = 0\nmin_inodes_pct = 0\n");
  // Earlier runs may have left I/O errors in the kernel log: count from what is there.
  // Wait for the backlog to be read: two samples a few cycles apart that agree.
  int seen = -1;
  for (int i = 0; i < 50; ++i) {
    int a = probe("kernel-log")["metrics"].value("io-error", 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int b = probe("kernel-log")["metrics"].value("io-error", 0);
    if (a == b) {
      seen = b;
      break;
    }
  }
  ASSERT_GE(seen, 0);
  // printk from user space (root): an I/O error line the classifier knows.
  ASSERT_TRUE(
      write_file("/dev/kmsg",
                 "<3>weft-hcs-test: I/O error, dev sdz, sector 2048 op 0x0:(READ) flags 0x0\n")
          .ok());
  json p;
  for (int i = 0; i < 100; ++i) {
    p = probe("kernel-log");
    if (p["metrics"].value("io-error", 0) == seen + 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(p["metrics"].value("io-error", 0), seen + 1) << p.dump();
  EXPECT_NE(p["state"], "ok") << p.dump();  // an I/O error in the window is at least degraded
}

}  // namespace
}  // namespace weft::testing
