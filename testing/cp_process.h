// For tests of weft-controlplane as a process (controlplane/process_*_test.cc): the
// fixture that runs one in a temporary directory (WEFT_CONTROLPLANE_BIN), with a Unix
// socket, a 200 ms heartbeat and metrics on loopback, and stops it at the end (a clean
// exit expected on SIGTERM; a failed test shows the end of its log).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "testing/process.h"

namespace weft::testing {

class ControlPlane : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-cp-test-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    // A key for secrets at rest, as the packages make one (a job's env is a secret).
    ASSERT_TRUE(
        write_file_atomic(dir_ + "/secrets.key", "k1 " + std::string(64, 'c') + "\n", 0600).ok());
    ASSERT_TRUE(write_file(dir_ + "/cp.toml", "socket = \"" + dir_ + "/cp.sock\"\nstate_dir = \"" +
                                                  dir_ +
                                                  "/state\"\nlisten = \"\"\n"
                                                  "heartbeat_interval = \"200ms\"\n"
                                                  "missed_heartbeats = 3\nlog_level = \"debug\"\n"
                                                  "metrics_listen = \"127.0.0.1:0\"\n"
                                                  // No task moves a test did not ask for
                                                  // (enable_rebalancer()).
                                                  "rebalancer.enabled = false\n" +
                                                  secrets_line())
                    .ok());
  }
#ifdef WEFTCTL_BIN
  // What an operator types: weftctl against this control plane; its exit code and what
  // it printed.
  std::pair<int, std::string> weftctl(const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    int rc =
        std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ + " " WEFTCTL_BIN " --controlplane " +
                     sock() + " " + args + " >" + out + " 2>&1")
                        .c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  }
#endif
  // More lines of cp.toml (before start()).
  void add_config(const std::string& lines) {
    ASSERT_TRUE(
        write_file(dir_ + "/cp.toml", read_file(dir_ + "/cp.toml").value_or("") + lines).ok());
  }
  // The ReBalancer's loop on, every second, `moves_per_round` moves a round.
  void enable_rebalancer(int moves_per_round = 5) {
    std::string conf = read_file(dir_ + "/cp.toml").value_or("");
    auto at = conf.find("rebalancer.enabled = false\n");
    ASSERT_NE(at, std::string::npos);
    conf.replace(at, std::string("rebalancer.enabled = false\n").size(),
                 "rebalancer.enabled = true\nrebalancer.interval = \"1s\"\n"
                 "rebalancer.moves_per_round = " +
                     std::to_string(moves_per_round) + "\n");
    ASSERT_TRUE(write_file(dir_ + "/cp.toml", conf).ok());
  }
  void TearDown() override {
    stop(SIGTERM);
    // A failed test shows the end of the control plane's log (a sanitizer's report, say).
    if (HasFailure()) {
      std::string log = read_file(dir_ + "/cp.log").value_or("");
      std::cerr << "--- the end of cp.log\n"
                << log.substr(log.size() > 12000 ? log.size() - 12000 : 0) << "\n";
    }
    (void)remove_tree(dir_);
  }
  void start() {
    pid_ = spawn_process({WEFT_CONTROLPLANE_BIN, "-c", dir_ + "/cp.toml"}, {dir_ + "/cp.log"});
    // Up to 30 s: a sanitizer build under a loaded suite starts slowly (a bounded poll,
    // not a fixed wait: docs/testing.md).
    for (int i = 0; i < 3000; ++i) {
      if (call("job.ls").ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "weft-controlplane did not start: " << read_file(dir_ + "/cp.log").value_or("");
  }
  void stop(int sig) {
    if (pid_ <= 0) return;
    int st = stop_process(pid_, sig);
    if (sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    }
  }
  Result<nlohmann::json> call(const std::string& m,
                              const nlohmann::json& p = nlohmann::json::object()) {
    TRY_ASSIGN(auto c, rpc::Client::connect(dir_ + "/cp.sock"));
    return c->call(m, p, 5000);
  }
  std::string sock() const {
    return dir_ + "/cp.sock";
  }
  std::string secrets_line() const {
    return "secrets_key = \"" + dir_ + "/secrets.key\"\n";
  }
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace weft::testing
