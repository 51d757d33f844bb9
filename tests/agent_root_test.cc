// Root tests of weft-agent on this machine's real cgroup2 tree: processes, namespaces,
// pivot_root, freeze, cgroup.kill, hugetlb limits, logs, restarts, bad input and crash
// recovery. Each test owns a uniquely named cgroup root and removes it (AgentHarness).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "tests/agent_harness.h"
#include "tests/cpu_record.h"

namespace weft::testing {
namespace {

// The agent enables the controllers it uses in the cgroups above its root (as systemd
// does with Delegate=yes). On this shared machine the cgroup2 root's subtree_control goes
// back the way it was when the last test that held it ends (SubtreeControlLease): here
// for the whole test program too, which also starts agents of its own.
class RestoreRootSubtreeControl : public ::testing::Environment {
 public:
  void SetUp() override {
    auto mount = HostPaths().cgroup2_mount();
    if (mount.ok() && geteuid() == 0) lease_ = std::make_unique<SubtreeControlLease>(*mount);
  }
  void TearDown() override { lease_.reset(); }

 private:
  std::unique_ptr<SubtreeControlLease> lease_;
};
[[maybe_unused]] auto* const kRestoreEnv =
    ::testing::AddGlobalTestEnvironment(new RestoreRootSubtreeControl);

class AgentRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    agent_ = std::make_unique<AgentHarness>();
    agent_->start();
  }
  void TearDown() override { agent_.reset(); }

  std::string run(json spec) {
    json r = agent_->call("task.run", spec);
    return r.value("id", "");
  }
  std::string logs(const std::string& id, const std::string& stream = "stdout") {
    json r = agent_->call("task.logs", {{"id", id}, {"stream", stream}});
    return r.value("data", "");
  }
  bool terminal(const json& t) {
    std::string s = t.value("state", "");
    return s == "exited" || s == "failed" || s == "stopped";
  }
  std::unique_ptr<AgentHarness> agent_;
};

TEST_F(AgentRoot, RunExitCodeLogsAndCgroupRemoved) {
  std::string id = run({{"name", "t1"}, {"argv", {"sh", "-c", "echo out; echo err >&2; exit 3"}}});
  ASSERT_FALSE(id.empty());
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["state"], "failed");
  EXPECT_EQ(t["exit_code"], 3);
  EXPECT_EQ(t["reason"], "exited with code 3");
  EXPECT_EQ(logs(id), "out\n");
  EXPECT_EQ(logs(id, "stderr"), "err\n");
  EXPECT_FALSE(path_exists(agent_->task_cgroup(id)));
  json ok = agent_->wait_state(run({{"name", "t2"}, {"argv", {"true"}}}), "exited");
  EXPECT_EQ(ok["exit_code"], 0);
}

// agent.toml log_journald: each line of output is also an entry of journald's native
// protocol with the task's fields (here a socket of the test's stands in for journald,
// which this machine does not run; the guest test reads the real journal).
TEST(AgentJournald, EveryLineIsAnEntryWithTheTasksFields) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  AgentHarness agent;
  std::string sock = agent.dir() + "/journal.sock";
  Fd rx(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(rx.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{10, 0};
  ::setsockopt(rx.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  agent.add_config("log_journald = true\njournald_socket = \"" + sock + "\"\n");
  agent.start();
  std::string line(20000, 'x');  // longer than an entry: sent in two
  json r = agent.call("task.run", {{"name", "noisy"},
                                   {"argv",
                                    {"sh", "-c",
                                     "echo hello journal; printf 'a\\nb'; "
                                     "echo; echo oops >&2; echo " +
                                         line}}});
  std::string id = r.value("id", "");
  agent.wait_state(id, "exited");
  // Entries: MESSAGE (binary-safe form) and "KEY=VALUE" lines.
  std::vector<std::map<std::string, std::string>> entries;
  for (int i = 0; i < 6; ++i) {
    std::string buf(65536, '\0');
    ssize_t n = ::recv(rx.get(), buf.data(), buf.size(), 0);
    if (n <= 0) break;
    buf.resize(static_cast<size_t>(n));
    std::map<std::string, std::string> e;
    size_t at = 0;
    while (at < buf.size()) {
      size_t nl = buf.find('\n', at);
      ASSERT_NE(nl, std::string::npos) << buf;
      std::string key = buf.substr(at, nl - at);
      size_t eq = key.find('=');
      if (eq != std::string::npos) {
        e[key.substr(0, eq)] = key.substr(eq + 1);
        at = nl + 1;
      } else {  // KEY\n, 64-bit little-endian length, data, \n
        uint64_t len = 0;
        for (int b = 0; b < 8; ++b)
          len |= uint64_t{static_cast<unsigned char>(buf[nl + 1 + b])} << (8 * b);
        e[key] = buf.substr(nl + 9, len);
        at = nl + 9 + len + 1;
      }
    }
    entries.push_back(e);
  }
  ASSERT_GE(entries.size(), 5u);
  std::vector<std::string> out, err;
  for (auto& e : entries) {
    EXPECT_EQ(e["WEFT_TASK"], "noisy");
    EXPECT_EQ(e["WEFT_TASK_ID"], id);
    EXPECT_EQ(e["SYSLOG_IDENTIFIER"], "noisy");
    EXPECT_EQ(e.count("WEFT_JOB"), 0u);  // a local task: no job
    (e["WEFT_STREAM"] == "stderr" ? err : out).push_back(e["MESSAGE"]);
    EXPECT_EQ(e["PRIORITY"], e["WEFT_STREAM"] == "stderr" ? "3" : "6");
  }
  ASSERT_GE(out.size(), 4u);
  EXPECT_EQ(out[0], "hello journal");
  EXPECT_EQ(out[1], "a");
  EXPECT_EQ(out[2], "b");
  EXPECT_EQ(err, std::vector<std::string>{"oops"});
  EXPECT_EQ(out[3].size() + (out.size() > 4 ? out[4].size() : 0), line.size());
  // The files have it all too.
  EXPECT_EQ(agent.call("task.logs", {{"id", id}, {"stream", "stderr"}})["data"], "oops\n");
}

// Named ports (docs/services.md): a 0 port takes a free port of the agent's port_range,
// given to the task as WEFT_PORT_<NAME> and kept in its spec; a port a live task holds
// is refused to another; once that task ended its port may be taken again.
TEST_F(AgentRoot, ALocalTasksPortsAreItsOwnWhileItLives) {
  std::string a = run({{"name", "pa"},
                       {"ports", {{"http", 0}, {"admin", 9931}}},
                       {"argv", {"sh", "-c", "echo $WEFT_PORT_HTTP $WEFT_PORT_ADMIN; sleep 100"}}});
  ASSERT_FALSE(a.empty());
  json t = agent_->wait_task(a, [&](const json&) { return !logs(a).empty(); });
  json shown = agent_->call("task.show", {{"id", a}});
  int http = shown["spec"]["ports"]["http"].get<int>();
  EXPECT_GE(http, 20000);
  EXPECT_LE(http, 32767);
  EXPECT_EQ(logs(a), std::to_string(http) + " 9931\n");
  auto refused = agent_->try_call(
      "task.run", {{"name", "pb"}, {"ports", {{"admin", 9931}}}, {"argv", {"true"}}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("ports.admin: port 9931 is held by task pa"),
            std::string::npos)
      << refused.error().str();
  // Another task's dynamic port is not the first's.
  std::string c =
      run({{"name", "pc"}, {"ports", {{"http", 0}}}, {"argv", {"sh", "-c", "sleep 100"}}});
  json other = agent_->call("task.show", {{"id", c}});
  EXPECT_NE(other["spec"]["ports"]["http"].get<int>(), http);
  agent_->call("task.stop", {{"id", a}, {"grace", 1}});
  agent_->wait_state(a, "stopped");
  auto again = agent_->try_call("task.run",
                                {{"name", "pd"}, {"ports", {{"admin", 9931}}}, {"argv", {"true"}}});
  EXPECT_TRUE(again.ok()) << again.error().str();
  agent_->call("task.stop", {{"id", c}, {"grace", 1}});
  agent_->wait_state(c, "stopped");
}

TEST_F(AgentRoot, ProcessRunsInsideItsCgroup) {
  std::string id =
      run({{"name", "cg"}, {"argv", {"sh", "-c", "cat /proc/self/cgroup; sleep 100"}}});
  json t = agent_->wait_task(id, [&](const json&) { return !logs(id).empty(); });
  EXPECT_NE(logs(id).find("0::/"), std::string::npos);
  auto procs = read_file(agent_->task_cgroup(id) + "/cgroup.procs");
  ASSERT_TRUE(procs.ok());
  EXPECT_NE(procs->find(std::to_string(t["pid"].get<int>())), std::string::npos);
  agent_->call("task.stop", {{"id", id}, {"grace", 5}});
  json s = agent_->wait_state(id, "stopped");
  EXPECT_EQ(s["signal"], "SIGTERM");
}

// task.usage (what autoscaling measures) against the cgroup's own counters: a task that
// spins shows the CPU its cgroup's cpu.stat says it used, an idle one next to none, and
// memory is memory.current.
TEST_F(AgentRoot, TaskUsageIsWhatTheCgroupCounted) {
  agent_.reset();
  agent_ = std::make_unique<AgentHarness>();
  agent_->add_config("usage_interval = \"1s\"\n");
  agent_->start();
  std::string busy = run({{"name", "busy"}, {"argv", {"sh", "-c", "while :; do :; done"}}});
  std::string idle = run({{"name", "idle"}, {"argv", {"sleep", "100"}}});
  agent_->wait_state(busy, "running");
  agent_->wait_state(idle, "running");
  // The cgroup's own counter read every 50 ms for 3 s, then the agent's figure: it is the
  // rate over one of the windows of about its interval (1 s) in that record.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CpuRecord record(agent_->task_cgroup(busy));
  record.record_for(3.0);
  json u = agent_->call("task.usage", {{"tasks", {"busy", "idle", "nosuch"}}});
  record.sample();
  std::string mem = read_file(agent_->task_cgroup(busy) + "/memory.current").value_or("0");
  ASSERT_TRUE(u["tasks"].contains("busy")) << u.dump();
  ASSERT_TRUE(u["tasks"].contains("idle")) << u.dump();
  EXPECT_FALSE(u["tasks"].contains("nosuch"));
  EXPECT_EQ(u["interval_ms"], 1000);
  double reported = u["tasks"]["busy"][0].get<double>();
  EXPECT_GT(record.mean_millicores(), 50) << "the spinning task hardly ran";
  double closest = record.closest(reported, 1.0);
  EXPECT_LE(closest, std::max(60.0, 0.1 * reported))
      << "no second of the cgroup's own record used what the agent says: " << u.dump();
  EXPECT_LT(u["tasks"]["idle"][0].get<double>(), 50) << u.dump();
  double mem_now = std::stod(mem);
  EXPECT_NEAR(u["tasks"]["busy"][1].get<double>(), mem_now, 0.25 * mem_now + 65536) << u.dump();
  // Bad input names the field.
  auto bad = agent_->try_call("task.usage", {{"tasks", {1}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("tasks[0]"), std::string::npos) << bad.error().str();
  for (const auto& id : {busy, idle}) {
    agent_->call("task.kill", {{"id", id}, {"signal", "SIGKILL"}});
  }
}

// An app metric (autoscaling's metric = "app"): task.usage with a scrape reads each
// task's named port and sums the metric; what cannot be read is a reason, not a figure.
// (A task on the machine's bridge is read from inside its network namespace:
// MultiMachine.AJobScalesOnItsOwnMetricReadOnItsBridge.)
TEST_F(AgentRoot, AnAppMetricIsScrapedFromTheTasksPort) {
  agent_.reset();
  agent_ = std::make_unique<AgentHarness>();
  agent_->add_config("usage_interval = \"1s\"\n");
  agent_->start();
  auto server = [&](const std::string& name, const std::string& network, const char* in_flight) {
    return run({{"name", name},
                {"ports", {{"http", 0}}},
                {"env", {{"SERVICE_IN_FLIGHT", in_flight}}},
                {"namespaces", {{"network", network}}},
                {"argv", {SERVICE_LOAD_BIN, "serve"}}});
  };
  std::string own = server("own", "host", "3.5");
  std::string host = server("host", "host", "1");
  std::string mute = run({{"name", "mute"}, {"ports", {{"http", 0}}}, {"argv", {"sleep", "100"}}});
  for (const auto& id : {own, host, mute}) agent_->wait_state(id, "running");
  json ask{{"tasks", {"own", "host", "mute"}},
           {"scrape",
            {{{"tasks", {"own", "host", "mute"}},
              {"port", "http"},
              {"path", "/metrics"},
              {"name", "service_in_flight"}}}}};
  json u;
  for (int i = 0; i < 100; ++i) {  // until both servers listen and every task has a sample
    u = agent_->call("task.usage", ask);
    if (u["tasks"].size() == 3 && u["tasks"]["own"].size() == 5 && u["tasks"]["host"].size() == 5)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(u["tasks"]["own"].size(), 5u) << u.dump();
  EXPECT_DOUBLE_EQ(u["tasks"]["own"][4].get<double>(), 3.5) << u.dump();
  EXPECT_DOUBLE_EQ(u["tasks"]["host"][4].get<double>(), 1.0) << u.dump();
  EXPECT_EQ(u["tasks"]["mute"].size(), 4u) << u.dump();
  ASSERT_TRUE(u["scrape_errors"].contains("mute")) << u.dump();
  // A metric the task does not serve.
  ask["scrape"][0]["name"] = "nope";
  json none = agent_->call("task.usage", ask);
  EXPECT_NE(none["scrape_errors"].value("own", "").find("no sample of nope"), std::string::npos)
      << none.dump();
  for (const auto& id : {own, host, mute})
    agent_->call("task.kill", {{"id", id}, {"signal", "SIGKILL"}});
}

TEST_F(AgentRoot, MissingBinaryFailsWithReasonAndNoCgroup) {
  std::string id = run({{"name", "nobin"}, {"argv", {"/no/such/binary"}}});
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["state"], "failed");
  EXPECT_NE(t["reason"].get<std::string>().find("No such file or directory"), std::string::npos);
  EXPECT_FALSE(path_exists(agent_->task_cgroup(id)));
  EXPECT_TRUE(agent_->task_cgroups().empty());
  std::string id2 = run({{"name", "nocwd"},
                         {"cwd", "/no/such/dir"},
                         {"argv", {"true"}},
                         {"restart", {{"policy", "always"}}}});
  json t2 = agent_->wait_task(id2, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t2["state"], "failed");
  EXPECT_EQ(t2["restarts"], 0);  // restarting cannot fix it
  EXPECT_EQ(t2["reason"],
            "cannot change to working directory /no/such/dir: No such file or directory");
  EXPECT_NE(logs(id2, "stderr").find("weft-init: cannot change to /no/such/dir"),
            std::string::npos);
}

// A removed task's directory is recycled with its exit record's file (agent/task_dirs.h),
// which weft-init overwrites in place: a shorter record leaves nothing of a longer one.
TEST_F(AgentRoot, ARecycledDirectoryKeepsNothingOfTheLastExitRecord) {
  std::string failed = run({{"name", "long"}, {"argv", {"/no/such/binary"}}});
  json t = agent_->wait_task(failed, [&](const json& j) { return terminal(j); });
  ASSERT_EQ(t["state"], "failed") << t.dump();
  agent_->call("task.remove", {{"id", failed}});
  for (int i = 0; i < 3; ++i) {
    std::string id = run({{"name", "short" + std::to_string(i)}, {"argv", {"true"}}});
    json done = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
    EXPECT_EQ(done["state"], "exited") << done.dump();
    EXPECT_EQ(done.value("exit_code", -1), 0) << done.dump();
    EXPECT_EQ(done.value("reason", ""), "") << done.dump();
    agent_->call("task.remove", {{"id", id}});
  }
}

TEST_F(AgentRoot, PidUtsAndPrivateNetworkNamespaces) {
  std::string id = run(
      {{"name", "ns"},
       {"hostname", "weft-box"},
       {"namespaces", {{"network", "private"}}},
       {"argv", {"sh", "-c", "echo pid=$$; hostname; cat /proc/net/dev; ps -e -o pid= -o comm="}}});
  agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  std::string out = logs(id);
  EXPECT_NE(out.find("pid=2\n"), std::string::npos) << out;  // weft-init is pid 1
  EXPECT_NE(out.find("weft-box\n"), std::string::npos) << out;
  EXPECT_NE(out.find("lo:"), std::string::npos) << out;
  auto host_dev = read_file("/proc/net/dev");
  ASSERT_TRUE(host_dev.ok());
  for (const auto& line : split(*host_dev, '\n')) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string ifname = trim(line.substr(0, colon));
    if (ifname != "lo") {
      EXPECT_EQ(out.find(ifname + ":"), std::string::npos) << ifname << " leaked into the task";
    }
  }
  EXPECT_NE(out.find("1 weft-init"), std::string::npos) << out;  // fresh /proc
}

TEST_F(AgentRoot, PivotRootIntoBusyboxRootfs) {
  if (!path_exists("/bin/busybox"))
    GTEST_SKIP() << "busybox-static is not installed (scripts/setup.sh installs it)";
  std::string rootfs = agent_->dir() + "/rootfs";
  ASSERT_TRUE(mkdir_p(rootfs + "/bin").ok());
  ASSERT_EQ(system(("cp /bin/busybox " + rootfs + "/bin/busybox").c_str()), 0);
  ASSERT_EQ(symlink("busybox", (rootfs + "/bin/sh").c_str()), 0);
  ASSERT_TRUE(write_file(rootfs + "/marker", "inside\n").ok());
  std::string id = run(
      {{"name", "rootfs"},
       {"rootfs", rootfs},
       {"argv",
        {"/bin/busybox", "sh", "-c",
         "cat /marker; echo \"ls:[$(ls / | tr '\\n' ' ')]\"; test -c /dev/null && echo devnull; "
         "/bin/busybox ps; echo x > /dev/null && echo writable"}}});
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["exit_code"], 0) << logs(id, "stderr");
  std::string out = logs(id);
  EXPECT_NE(out.find("inside\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ls:[bin dev marker proc ]"), std::string::npos) << "not the rootfs: " << out;
  EXPECT_NE(out.find("devnull"), std::string::npos) << out;
  EXPECT_NE(out.find("writable"), std::string::npos) << out;
  EXPECT_NE(out.find("weft-init"), std::string::npos) << out;
}

TEST_F(AgentRoot, FreezeAndThawThroughCgroupFreeze) {
  std::string id = run({{"name", "fz"}, {"argv", {"sleep", "100"}}});
  agent_->wait_state(id, "running");
  json f = agent_->call("task.freeze", {{"id", id}});
  EXPECT_TRUE(f["frozen"].get<bool>());
  auto ev = read_file(agent_->task_cgroup(id) + "/cgroup.events");
  EXPECT_NE(ev.value_or("").find("frozen 1"), std::string::npos);
  json s = agent_->call("task.show", {{"id", id}});
  EXPECT_TRUE(s["frozen"].get<bool>());
  json th = agent_->call("task.thaw", {{"id", id}});
  EXPECT_FALSE(th["frozen"].get<bool>());
  ev = read_file(agent_->task_cgroup(id) + "/cgroup.events");
  EXPECT_NE(ev.value_or("").find("frozen 0"), std::string::npos);
  // A frozen task still stops: the agent thaws it first.
  agent_->call("task.freeze", {{"id", id}});
  agent_->call("task.stop", {{"id", id}, {"grace", 10}});
  EXPECT_EQ(agent_->wait_state(id, "stopped")["signal"], "SIGTERM");
}

TEST_F(AgentRoot, StopEscalatesToCgroupKillAfterGrace) {
  std::string id =
      run({{"name", "stubborn"},
           {"stop_grace", "300ms"},
           {"argv", {"sh", "-c", "trap '' TERM; echo ready; while true; do sleep 1; done"}}});
  agent_->wait_task(id, [&](const json&) { return logs(id) == "ready\n"; });
  auto t0 = std::chrono::steady_clock::now();
  agent_->call("task.stop", {{"id", id}});
  json t = agent_->wait_state(id, "stopped");
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));  // the grace period was honoured
  EXPECT_EQ(t["signal"], "SIGKILL");
  EXPECT_FALSE(path_exists(agent_->task_cgroup(id)));
}

TEST_F(AgentRoot, KillSignalsAndCgroupKill) {
  std::string id = run({{"name", "k"}, {"argv", {"sleep", "100"}}});
  agent_->wait_state(id, "running");
  agent_->call("task.kill", {{"id", id}, {"signal", "SIGUSR1"}});
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["signal"], "SIGUSR1");  // forwarded by weft-init to the main process
  std::string id2 = run({{"name", "k2"}, {"argv", {"sh", "-c", "sleep 100 & sleep 100"}}});
  agent_->wait_state(id2, "running");
  agent_->call("task.kill", {{"id", id2}});
  json t2 = agent_->wait_task(id2, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t2["state"], "failed");
  EXPECT_FALSE(path_exists(agent_->task_cgroup(id2)));
}

TEST_F(AgentRoot, RestartWithBackoffUntilLimit) {
  std::string id = run({{"name", "flappy"},
                        {"argv", {"sh", "-c", "echo run; exit 2"}},
                        {"restart",
                         {{"policy", "on-failure"},
                          {"delay", "100ms"},
                          {"max_delay", "200ms"},
                          {"max_restarts", 2}}}});
  json t = agent_->wait_task(
      id, [&](const json& j) { return j["state"] == "failed" && j["restarts"] == 2; });
  EXPECT_EQ(t["incarnation"], 3);
  EXPECT_EQ(t["exit_code"], 2);
  EXPECT_NE(t["reason"].get<std::string>().find("restart limit"), std::string::npos);
  EXPECT_EQ(logs(id), "run\nrun\nrun\n");
  // "always" restarts successful exits too; stop ends it for good.
  std::string a = run({{"name", "always"},
                       {"argv", {"true"}},
                       {"restart", {{"policy", "always"}, {"delay", "50ms"}}}});
  agent_->wait_task(a, [&](const json& j) { return j["restarts"].get<int>() >= 2; });
  agent_->call("task.stop", {{"id", a}});
  json st = agent_->wait_state(a, "stopped");
  int restarts = st["restarts"];
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(agent_->call("task.show", {{"id", a}})["restarts"], restarts);
}

// Issue 48: a local task alive but stuck. Its liveness check (exec, inside the task)
// fails three times in a row: the agent kills it and its restart policy starts it
// again; the reason says why. The check's cgroup is its own, beside readiness's.
TEST_F(AgentRoot, AStuckLocalTaskIsKilledByItsLivenessCheckAndRestarted) {
  std::string d = agent_->dir() + "/live";
  ASSERT_TRUE(mkdir_p(d).ok());
  ASSERT_EQ(::chmod(d.c_str(), 0777), 0);
  ASSERT_TRUE(write_file(d + "/stuck", "").ok());
  std::string id =
      run({{"name", "stuck"},
           {"argv", {"sleep", "600"}},
           {"restart", {{"policy", "always"}, {"delay", "100ms"}}},
           {"readiness",
            {{"type", "exec"}, {"command", {"/bin/sh", "-c", "true"}}, {"interval", "100ms"}}},
           {"liveness",
            {{"type", "exec"},
             {"command", {"/bin/sh", "-c", "test ! -e " + d + "/stuck"}},
             {"interval", "200ms"},
             {"failure_threshold", 3}}}});
  json t = agent_->wait_task(id, [](const json& j) { return j["restarts"].get<int>() >= 1; });
  EXPECT_NE(t["reason"].get<std::string>().find(
                "killed: 3 liveness checks failed in a row, the last: exit status 1"),
            std::string::npos)
      << t.dump(2);
  // Live again: it runs on, restarted no more, and ready (both checks side by side).
  ASSERT_EQ(::unlink((d + "/stuck").c_str()), 0);
  t = agent_->wait_task(id, [](const json& j) {
    return j["state"] == "running" && j["liveness"]["failures_in_a_row"] == 0 &&
           j.value("ready", false);
  });
  int restarts = t["restarts"];
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  json now = agent_->call("task.show", {{"id", id}});
  EXPECT_EQ(now["restarts"], restarts) << now.dump(2);
  EXPECT_EQ(now["liveness"]["failures_in_a_row"], 0) << now.dump(2);
  EXPECT_TRUE(now.value("ready", false)) << now.dump(2);
  agent_->call("task.stop", {{"id", id}});
  agent_->wait_state(id, "stopped");
}

// Issue 59: a liveness check that writes 50 MB and then hangs (a child left behind in
// the background, and itself asleep) times out, counts as failed, and takes its whole
// process tree with it: no check's process outlives its timeout, and after three the
// task is killed for it.
TEST_F(AgentRoot, ALivenessCheckThatHangsAfterWritingTimesOutAndLeavesNothingBehind) {
  std::string d = agent_->dir() + "/hang";
  ASSERT_TRUE(mkdir_p(d).ok());
  ASSERT_EQ(::chmod(d.c_str(), 0777), 0);
  // Check n (0, 1, ...) marks its start, writes 50 MB, and hangs in `sleep 7000+n` (in
  // the background) and `sleep 8000+n`.
  const std::string check = "n=$(ls " + d + " | wc -l); touch " + d +
                            "/c$n; head -c 50000000 /dev/zero; sleep $((7000+n)) & "
                            "sleep $((8000+n))";
  std::string id = run({{"name", "hangs"},
                        {"argv", {"sleep", "600"}},
                        {"restart", {{"policy", "never"}}},
                        {"liveness",
                         {{"type", "exec"},
                          {"command", {"/bin/sh", "-c", check}},
                          {"interval", "2s"},
                          {"timeout", "1s"},
                          {"failure_threshold", 3}}}});
  // Processes whose command line is `sleep N`.
  auto sleeping = [](int n) {
    size_t count = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      std::string cmd = read_file(e.path().string() + "/cmdline").value_or("");
      std::replace(cmd.begin(), cmd.end(), '\0', ' ');
      count += cmd == "sleep " + std::to_string(n) + " ";
    }
    return count;
  };
  // Once the second check has started, the first's whole tree is gone (its timeout
  // killed it, the child in the background too).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(d + "/c1") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(std::filesystem::exists(d + "/c1")) << agent_->call("task.show", {{"id", id}}).dump();
  while ((sleeping(7000) + sleeping(8000)) > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(sleeping(7000) + sleeping(8000), 0u) << "the first check's processes outlived it";
  // Three timeouts in a row: the task is killed, the last failure said.
  json t = agent_->wait_task(
      id, [](const json& j) { return j["state"] != "running" && j["state"] != "starting"; });
  // (The last failure's detail is "timed out after 1000ms" on a quiet machine; in one
  // whole-suite run under load it was "killed by signal 9": a check's weft-init killed
  // before its own timeout, not yet understood (docs: the issue 59 note). The count and
  // the clean-up are what this asserts.)
  EXPECT_NE(t["reason"].get<std::string>().find("killed: 3 liveness checks failed in a row"),
            std::string::npos)
      << t.dump(2);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto left = [&] {
    size_t n = 0;
    for (int i = 0; i < 4; ++i) n += sleeping(7000 + i) + sleeping(8000 + i);
    return n;
  };
  while (left() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(left(), 0u) << "a check's process outlived it";
}

TEST_F(AgentRoot, LogsRotateByNewFilesWithBoundedSize) {
  std::string id =
      run({{"name", "chatty"},
           {"logs", {{"max_file_size", "4K"}, {"max_files", 3}}},
           {"argv",
            {"sh", "-c",
             "i=0; while [ $i -lt 2000 ]; do echo \"line $i ..............................\"; "
             "i=$((i+1)); done"}}});
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  const json& out = t["logs"]["stdout"];
  EXPECT_EQ(out["files"], 3);
  EXPECT_LE(out["bytes"].get<uint64_t>(), 3u * 4096);
  EXPECT_GT(out["dropped_bytes"].get<uint64_t>(), 50000u);
  json tail = agent_->call("task.logs", {{"id", id}, {"tail", 1}});
  EXPECT_EQ(tail["data"], "line 1999 ..............................\n");
}

TEST_F(AgentRoot, HugetlbLimitWrittenBeforeStart) {
  json info = agent_->call("agent.info", json::object());
  bool has = false;
  for (const auto& c : info["controllers"]) has |= c == "hugetlb";
  bool has2m = false;
  for (const auto& s : info["hugepage_sizes"]) has2m |= s == "2MB";
  if (!has || !has2m) GTEST_SKIP() << "no hugetlb controller with 2MB pages";
  // The task reads its own limit: it was in force before the process started.
  std::string id = run({{"name", "huge"},
                        {"resources", {{"hugetlb", {{"2M", "8M"}}}}},
                        {"argv",
                         {"sh", "-c",
                          "cg=$(grep ^0:: /proc/self/cgroup | cut -d: -f3); "
                          "cat /sys/fs/cgroup/unified$cg/hugetlb.2MB.max 2>/dev/null "
                          "|| cat /sys/fs/cgroup$cg/hugetlb.2MB.max"}},
                        {"namespaces", {{"pid", false}, {"mount", false}}}});
  agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(logs(id), "8388608\n");
}

// Host-wide: needs huge pages in the machine's pool. Opt-in (WEFT_HOST_WIDE_TESTS=1, set
// by scripts/test.sh and CI); saves nr_hugepages and restores it.
TEST_F(AgentRoot, HugetlbLimitIsEnforced) {
  if (!std::getenv("WEFT_HOST_WIDE_TESTS"))
    GTEST_SKIP() << "host-wide test (changes nr_hugepages): set WEFT_HOST_WIDE_TESTS=1";
  json info = agent_->call("agent.info", json::object());
  bool has2m = false;
  for (const auto& s : info["hugepage_sizes"]) has2m |= s == "2MB";
  ASSERT_TRUE(has2m) << "no 2MB hugetlb pages on a machine meant to have them: " << info.dump();
  const std::string pool = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  std::string saved = trim(read_file(pool + "nr_hugepages").value_or(""));
  ASSERT_FALSE(saved.empty());
  struct Restore {
    std::string file, value;
    ~Restore() { (void)write_file(file, value); }
  } restore{pool + "nr_hugepages", saved};
  uint64_t want = std::stoull(saved) + 4;
  ASSERT_TRUE(write_file(pool + "nr_hugepages", std::to_string(want)).ok());
  ASSERT_GE(std::stoull(trim(read_file(pool + "free_hugepages").value_or("0"))), 3u)
      << "the kernel could not allocate huge pages for the test";

  json base = {{"argv", {HUGETLB_TOUCH_BIN, "3"}},
               {"namespaces", {{"pid", false}, {"mount", false}}}};
  json limited = base;
  limited["name"] = "huge-limited";
  limited["resources"] = {{"hugetlb", {{"2M", "2M"}}}};  // one page
  std::string id = run(limited);
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["signal"], "SIGBUS") << t.dump();  // the second page is over the limit
  EXPECT_EQ(logs(id), "touched 1\n");
  json roomy = base;
  roomy["name"] = "huge-roomy";
  roomy["resources"] = {{"hugetlb", {{"2M", "8M"}}}};
  std::string id2 = run(roomy);
  json t2 = agent_->wait_task(id2, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t2["exit_code"], 0) << t2.dump();
  EXPECT_EQ(logs(id2), "touched 1\ntouched 2\ntouched 3\n");
}

TEST_F(AgentRoot, MissingControllerRejectedUnlessBestEffort) {
  json info = agent_->call("agent.info", json::object());
  bool has_memory = false;
  for (const auto& c : info["controllers"]) has_memory |= c == "memory";
  if (has_memory) GTEST_SKIP() << "this machine has the memory controller on cgroup2";
  auto r = agent_->try_call(
      "task.run", {{"name", "m"}, {"argv", {"true"}}, {"resources", {{"memory_max", "64M"}}}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, rpc::kInvalidParams);
  EXPECT_NE(r.error().message.find("resources.memory_max"), std::string::npos);
  EXPECT_TRUE(agent_->call("task.ls", json::object())["tasks"].empty());
  EXPECT_TRUE(agent_->task_cgroups().empty());
  json ok =
      agent_->call("task.run", {{"name", "m"},
                                {"argv", {"true"}},
                                {"resources", {{"memory_max", "64M"}, {"best_effort", true}}}});
  ASSERT_EQ(ok["warnings"].size(), 1u);
}

TEST_F(AgentRoot, BadInputGetsErrorsAndDaemonKeepsServing) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  strcpy(sa.sun_path, agent_->socket().c_str());
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  auto exchange = [&](const std::string& out) {
    EXPECT_EQ(write(fd, out.data(), out.size()), static_cast<ssize_t>(out.size()));
    std::string got;
    char c;
    pollfd p{fd, POLLIN, 0};
    while (poll(&p, 1, 5000) > 0 && read(fd, &c, 1) == 1 && c != '\n') got += c;
    return json::parse(got, nullptr, false);
  };
  EXPECT_EQ(exchange("this is not json\n")["error"]["code"], rpc::kParseError);
  EXPECT_EQ(exchange(std::string(2 << 20, 'a') + "\n")["error"]["code"], rpc::kLineTooLong);
  json bad = exchange(
      R"({"jsonrpc":"2.0","id":7,"method":"task.run","params":{"name":"x","argv":["true"],"restart":{"policy":"sometimes"}}})"
      "\n");
  EXPECT_EQ(bad["error"]["code"], rpc::kInvalidParams);
  EXPECT_EQ(bad["error"]["data"]["field"], "restart.policy");
  json nf = exchange(R"({"jsonrpc":"2.0","id":8,"method":"task.show","params":{"id":"nope"}})"
                     "\n");
  EXPECT_EQ(nf["error"]["code"], rpc::kNotFound);
  json wrong_type = exchange(R"({"jsonrpc":"2.0","id":9,"method":"task.stop","params":{"id":5}})"
                             "\n");
  EXPECT_EQ(wrong_type["error"]["code"], rpc::kInvalidParams);
  json info = exchange(R"({"jsonrpc":"2.0","id":10,"method":"agent.info"})"
                       "\n");
  EXPECT_EQ(info["id"], 10);
  EXPECT_TRUE(info.contains("result"));
  close(fd);
  EXPECT_TRUE(agent_->call("task.ls", json::object())["tasks"].empty());
  EXPECT_TRUE(agent_->task_cgroups().empty());
  // Duplicate live names are refused, naming the existing task.
  std::string id = run({{"name", "dup"}, {"argv", {"sleep", "100"}}});
  auto dup = agent_->try_call("task.run", {{"name", "dup"}, {"argv", {"true"}}});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, rpc::kConflict);
  EXPECT_NE(dup.error().message.find(id), std::string::npos);
}

TEST_F(AgentRoot, MutatingCallsNeedPrivilege) {
  // The socket is 0660 root:weft; open it up so an unprivileged peer can connect at all
  // and we reach the credential check behind it.
  ASSERT_EQ(chmod(agent_->socket().c_str(), 0666), 0);
  ASSERT_EQ(chmod(agent_->dir().c_str(), 0755), 0);
  std::string done = run({{"name", "done"}, {"argv", {"true"}}, {"env", {{"TOKEN", "s3cr3t"}}}});
  agent_->wait_state(done, "exited");
  EXPECT_EQ(agent_->call("task.show", {{"id", done}})["spec"]["env"]["TOKEN"], "s3cr3t");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t p = fork();
  if (p == 0) {
    close(pipefd[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    auto c = rpc::Client::connect(agent_->socket());
    if (!c.ok()) _exit(4);
    auto ls = (*c)->call("task.ls", json::object());
    auto run = (*c)->call("task.run", {{"name", "evil"}, {"argv", {"true"}}});
    auto wait = (*c)->call("task.wait", {{"id", done}});
    auto wait_rm = (*c)->call("task.wait", {{"id", done}, {"remove", true}});
    auto show = (*c)->call("task.show", {{"id", done}});
    char res[5] = {ls.ok() ? '1' : '0',
                   !run.ok() && run.error().code == rpc::kPermissionDenied ? '1' : '0',
                   wait.ok() ? '1' : '0',
                   !wait_rm.ok() && wait_rm.error().code == rpc::kPermissionDenied ? '1' : '0',
                   show.ok() && (*show)["spec"]["env"]["TOKEN"] == "(hidden)" ? '1' : '0'};
    (void)!write(pipefd[1], res, 5);
    _exit(0);
  }
  close(pipefd[1]);
  char res[5] = {0, 0, 0, 0, 0};
  EXPECT_EQ(read(pipefd[0], res, 5), 5);
  close(pipefd[0]);
  waitpid(p, nullptr, 0);
  EXPECT_EQ(res[0], '1') << "reads are allowed";
  EXPECT_EQ(res[1], '1') << "task.run by nobody must be refused";
  EXPECT_EQ(res[2], '1') << "task.wait is a read";
  EXPECT_EQ(res[3], '1') << "task.wait with remove by nobody must be refused";
  EXPECT_EQ(res[4], '1') << "a task's secrets are not shown to nobody";
  json ls = agent_->call("task.ls", json::object());
  ASSERT_EQ(ls["tasks"].size(), 1u) << ls.dump();  // "done", not removed
  EXPECT_EQ(ls["tasks"][0]["id"], done);
}

// ---------------------------------------------------------------- restart safety

TEST_F(AgentRoot, TasksSurviveAgentRestartAndAreAdopted) {
  std::string id = run({{"name", "survivor"}, {"argv", {"sleep", "100"}}});
  json t = agent_->wait_state(id, "running");
  int pid = t["pid"];
  agent_->terminate();
  EXPECT_EQ(kill(pid, 0), 0) << "task died with the agent";
  agent_->start();
  json again = agent_->call("task.show", {{"id", id}});
  EXPECT_EQ(again["state"], "running");
  EXPECT_EQ(again["pid"], pid);
  agent_->call("task.stop", {{"id", id}});
  EXPECT_EQ(agent_->wait_state(id, "stopped")["signal"], "SIGTERM");
}

TEST_F(AgentRoot, ExitWhileAgentDownIsCollected) {
  std::string id = run({{"name", "quick"}, {"argv", {"sh", "-c", "sleep 0.5; exit 9"}}});
  agent_->wait_state(id, "running");
  agent_->kill9();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  agent_->start();
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["state"], "failed");
  EXPECT_EQ(t["exit_code"], 9);
  EXPECT_TRUE(agent_->task_cgroups().empty());
}

// task.wait: a long poll answered when the task ends (not when it waits to restart),
// or at its deadline with "ended": false; bad input names the field.
TEST_F(AgentRoot, TaskWaitIsAnsweredWhenTheTaskEnds) {
  std::string id =
      run({{"name", "waited"},
           {"argv", {"sh", "-c", "sleep 0.4; exit 4"}},
           {"restart", {{"policy", "on-failure"}, {"delay", "200ms"}, {"max_restarts", 1}}}});
  ASSERT_FALSE(id.empty());
  auto short_wait = agent_->try_call("task.wait", {{"id", id}, {"wait_ms", 100}});
  ASSERT_TRUE(short_wait.ok()) << short_wait.error().str();
  EXPECT_FALSE((*short_wait)["ended"].get<bool>());
  auto t0 = std::chrono::steady_clock::now();
  auto ended = agent_->try_call("task.wait", {{"id", id}, {"wait_ms", 20000}});
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(ended.ok()) << ended.error().str();
  EXPECT_TRUE((*ended)["ended"].get<bool>()) << ended->dump();
  EXPECT_EQ((*ended)["state"], "failed");
  EXPECT_EQ((*ended)["exit_code"], 4);
  EXPECT_EQ((*ended)["restarts"], 1);  // the backoff between the two runs did not answer
  EXPECT_GE(s, 0.6);  // two runs of 0.4 s and the 0.2 s delay, less the first's head start
  // Once ended: at once.
  EXPECT_TRUE(agent_->call("task.wait", {{"id", id}})["ended"].get<bool>());
  auto bad = agent_->try_call("task.wait", {{"id", id}, {"wait_ms", "soon"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("wait_ms"), std::string::npos) << bad.error().str();
  EXPECT_FALSE(agent_->try_call("task.wait", {{"id", "no-such-task"}}).ok());
  // "remove": the ended task is forgotten as the wait is answered.
  std::string quick = run({{"name", "quick"}, {"argv", {"sh", "-c", "sleep 0.2"}}});
  json gone = agent_->call("task.wait", {{"id", quick}, {"wait_ms", 20000}, {"remove", true}});
  EXPECT_EQ(gone["state"], "exited");
  EXPECT_TRUE(gone.value("removed", false)) << gone.dump();
  EXPECT_FALSE(agent_->try_call("task.show", {{"id", quick}}).ok());
  EXPECT_FALSE(path_exists(agent_->dir() + "/state/tasks/" + quick));
}

// weftctl task run --wait [--rm]: weftctl's exit status is the task's; --rm forgets it.
TEST_F(AgentRoot, RunWaitExitsWithTheTasksStatus) {
  auto weftctl = [&](const std::string& args) {
    std::string cmd =
        std::string(WEFTCTL_BIN) + " --agent " + agent_->socket() + " " + args + " >/dev/null 2>&1";
    int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  EXPECT_EQ(weftctl("task run --wait --name w7 -- sh -c 'exit 7'"), 7);
  EXPECT_EQ(weftctl("task run --wait --name wk -- sh -c 'kill -TERM $$'"), 128 + SIGTERM);
  EXPECT_EQ(weftctl("task run --wait --rm --name w0 -- true"), 0);
  EXPECT_EQ(weftctl("task run --wait --name wf -- /no/such/program"), 127);  // as a shell
  json ls = agent_->call("task.ls", json::object());
  std::set<std::string> names;
  for (const auto& t : ls["tasks"]) names.insert(t.value("name", ""));
  EXPECT_EQ(names, (std::set<std::string>{"w7", "wk", "wf"})) << ls.dump();  // w0: --rm
  EXPECT_NE(weftctl("task run --rm --name nowait -- true"), 0);              // --rm needs --wait
}

// Issue 43 (8): a task's output does not drive the operator's terminal. weftctl task
// logs on a terminal (a pty from script(1)) shows its control characters as \xNN; with
// --raw, or into a pipe, the bytes are as the task wrote them.
TEST_F(AgentRoot, TaskOutputOnATerminalShowsControlCharactersEscaped) {
  std::string id =
      run({{"name", "ansi"}, {"argv", {"sh", "-c", "printf 'a\\033]0;owned\\007b\\033[2Jc\\n'"}}});
  agent_->wait_task(id, [](const json& j) { return j["state"] == "exited"; });
  ASSERT_EQ(logs(id),
            "a\x1b]0;owned\x07"
            "b\x1b[2Jc\n");
  auto on_a_tty = [&](const std::string& args) {
    std::string out = agent_->dir() + "/tty.out";
    std::string cmd = "script -qec '" + std::string(WEFTCTL_BIN) + " --agent " + agent_->socket() +
                      " task logs --stream stdout " + args + " ansi' " + out + " >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return read_file(out).value_or("");
  };
  std::string shown = on_a_tty("");
  EXPECT_NE(shown.find("a\\x1b]0;owned\\x07b\\x1b[2Jc"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("\x1b]0;owned"), std::string::npos) << shown;
  EXPECT_EQ(shown.find('\x07'), std::string::npos) << shown;
  std::string raw = on_a_tty("--raw");
  EXPECT_NE(raw.find("a\x1b]0;owned\x07"
                     "b\x1b[2Jc"),
            std::string::npos)
      << raw;
  // Into a pipe: as written.
  std::string piped = agent_->dir() + "/piped.out";
  ASSERT_EQ(std::system((std::string(WEFTCTL_BIN) + " --agent " + agent_->socket() +
                         " task logs --stream stdout ansi > " + piped)
                            .c_str()),
            0);
  EXPECT_EQ(read_file(piped).value_or(""),
            "a\x1b]0;owned\x07"
            "b\x1b[2Jc\n");
}

// The exit record is not flushed to disk (docs/decisions.md): a task whose record is
// missing after the machine restarted is reported as ended with the machine.
TEST_F(AgentRoot, ATaskOfAnEarlierBootEndedWithTheMachine) {
  std::string id = run({{"name", "booted"}, {"argv", {"sleep", "100"}}});
  json t = agent_->wait_state(id, "running");
  agent_->kill9();
  destroy_cgroup_tree(agent_->task_cgroup(id));  // the machine went down, with the task
  ::unlink((agent_->dir() + "/state/tasks/" + id + "/exit").c_str());
  ASSERT_TRUE(write_file(agent_->dir() + "/state/boot_id", "an-earlier-boot\n").ok());
  agent_->start();
  json after = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(after["reason"], "the machine restarted while the task ran") << after.dump();
  EXPECT_EQ(trim(read_file(agent_->dir() + "/state/boot_id").value_or("")),
            trim(read_file("/proc/sys/kernel/random/boot_id").value_or("?")));
  EXPECT_TRUE(agent_->task_cgroups().empty());
}

TEST_F(AgentRoot, PendingRestartSurvivesAgentCrash) {
  std::string id =
      run({{"name", "later"},
           {"argv", {"sh", "-c", "echo run; exit 1"}},
           {"restart", {{"policy", "on-failure"}, {"delay", "1s"}, {"max_restarts", 1}}}});
  agent_->wait_state(id, "backoff");
  agent_->kill9();
  agent_->start();
  json t = agent_->wait_task(
      id, [](const json& j) { return j["state"] == "failed" && j["incarnation"] == 2; });
  EXPECT_EQ(t["restarts"], 1);
  EXPECT_EQ(logs(id), "run\nrun\n");  // restarted exactly once, by the new agent
}

TEST_F(AgentRoot, UnknownCgroupsAreKilledAndRemoved) {
  agent_->terminate();
  std::string stray = agent_->cgroup_root() + "/tasks/stray0000";
  ASSERT_EQ(mkdir(stray.c_str(), 0755), 0);
  pid_t p = fork();
  if (p == 0) {
    (void)!write_file(stray + "/cgroup.procs", "0").ok();
    execlp("sleep", "sleep", "100", nullptr);
    _exit(1);
  }
  for (int i = 0; i < 200 && trim(read_file(stray + "/cgroup.procs").value_or("")).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  agent_->start();
  EXPECT_FALSE(path_exists(stray));
  int status = 0;
  EXPECT_EQ(waitpid(p, &status, 0), p);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// SIGKILL the agent at each step of a task's life; after a restart there must be
// exactly one record, no orphan process or cgroup, and no lost exit. With the host's
// network the task takes one of the sandboxes made ahead (the pool's first namespace
// set), so each step is crossed on the hand-off path; with a private network (a set not
// asked for yet) on the usual path, its namespace from the agent's netns pool. What
// the dead agent held (sandboxes, namespaces) is gone after the restart.
// A point of a task's start, and whether the task has a network of its own (the usual
// start) or the host's (a sandbox's hand-off): what CrashAt and FailAt are run at.
class AtPoint : public AgentRoot,
                public ::testing::WithParamInterface<std::tuple<const char*, bool>> {
 public:
  static std::string name_of(const ::testing::TestParamInfo<ParamType>& p) {
    std::string n = std::get<0>(p.param);
    std::replace(n.begin(), n.end(), '.', '_');
    return n + (std::get<1>(p.param) ? "_PrivateNet" : "_HostNet");
  }

 protected:
  std::string point() const { return std::get<0>(GetParam()); }
  bool private_net() const { return std::get<1>(GetParam()); }
  json sleeper(const char* name) const {
    json spec = {{"name", name}, {"argv", {"sleep", "100"}}};
    if (private_net()) spec["namespaces"] = {{"network", "private"}};
    return spec;
  }
  // The two sandboxes the agent makes ahead, once made.
  std::vector<std::string> made_sandboxes() {
    std::vector<std::string> ids;
    for (int i = 0; i < 500 && ids.size() < 2; ++i, sleep_ms(10)) ids = agent_->sandbox_ids();
    return ids;
  }
};

class CrashAt : public AtPoint {};

TEST_P(CrashAt, StartIsRecoveredWithoutOrphansOrDuplicates) {
  const std::string point = this->point();
  const bool private_net = this->private_net();
  agent_->terminate();
  agent_->start(point);
  json spec = sleeper("crashy");
  std::vector<std::string> sandboxes = made_sandboxes();
  ASSERT_EQ(sandboxes.size(), 2u) << "the agent made no sandboxes ahead";
  auto r = agent_->try_call("task.run", spec);
  EXPECT_FALSE(r.ok()) << "the agent should have died at " << point;
  ASSERT_TRUE(agent_->wait_dead()) << "agent did not crash at " << point;
  agent_->start();
  json ls = agent_->call("task.ls", json::object());
  ASSERT_EQ(ls["tasks"].size(), 1u) << ls.dump();
  json t = ls["tasks"][0];
  std::string id = t["id"];
  // Which path the start took: a sandbox's id, or one of its own.
  EXPECT_EQ(std::count(sandboxes.begin(), sandboxes.end(), id), private_net ? 0 : 1) << id;
  for (const auto& sb : sandboxes) {  // the dead agent's sandboxes are gone
    if (sb != id) {
      EXPECT_FALSE(path_exists(agent_->task_cgroup(sb))) << sb;
      EXPECT_FALSE(path_exists(agent_->dir() + "/state/tasks/" + sb)) << sb;
    }
  }
  if (point == "start.spawned") {
    EXPECT_EQ(t["state"], "running") << t.dump();  // the started process was adopted
    EXPECT_EQ(agent_->task_cgroups(), std::vector<std::string>{id});
    auto procs = read_file(agent_->task_cgroup(id) + "/cgroup.procs");
    EXPECT_NE(procs.value_or("").find(std::to_string(t["pid"].get<int>())), std::string::npos);
    auto net = [](const std::string& pid) {
      std::error_code ec;
      return std::filesystem::read_symlink("/proc/" + pid + "/ns/net", ec).string();
    };
    std::string task_net = net(std::to_string(t["pid"].get<int>()));
    EXPECT_FALSE(task_net.empty());
    EXPECT_EQ(task_net != net("self"), private_net) << task_net;
    agent_->call("task.stop", {{"id", id}});
    agent_->wait_state(id, "stopped");
  } else {
    EXPECT_EQ(t["state"], "failed") << t.dump();  // never ran: reported, not run twice
    EXPECT_NE(t["reason"].get<std::string>().find("agent restarted"), std::string::npos);
  }
  EXPECT_TRUE(agent_->task_cgroups().empty());
  // A retry with the same name now works and runs exactly one task.
  std::string id2 = run({{"name", "crashy"}, {"argv", {"true"}}});
  EXPECT_EQ(agent_->wait_state(id2, "exited")["exit_code"], 0);
}
INSTANTIATE_TEST_SUITE_P(Lifecycle, CrashAt,
                         ::testing::Combine(::testing::Values("run.recorded", "start.cgroup",
                                                              "start.spawned"),
                                            ::testing::Bool()),
                         CrashAt::name_of);

// A start that fails part-way leaves nothing of itself (the agent's StartUndo): made to
// fail once at each point, with a sandbox given (the host's network: the pool's
// namespace set) and without (a private network, its namespace from the netns pool),
// the caller gets the error, and no task, cgroup, directory or sandbox of it is left;
// the agent keeps serving and the same start then works.
class FailAt : public AtPoint {};

TEST_P(FailAt, AStartThatFailsPartWayLeavesNothingBehind) {
  const std::string point = this->point();
  const bool private_net = this->private_net();
  agent_->terminate();
  agent_->start("", point);
  json spec = sleeper("undone");
  std::vector<std::string> sandboxes = made_sandboxes();
  ASSERT_EQ(sandboxes.size(), 2u) << "the agent made no sandboxes ahead";
  auto r = agent_->try_call("task.run", spec);
  ASSERT_FALSE(r.ok()) << r->dump();
  EXPECT_NE(r.error().str().find("injected failure at " + point), std::string::npos)
      << r.error().str();
  EXPECT_EQ(agent_->call("task.ls", json::object())["tasks"].size(), 0u);
  EXPECT_TRUE(agent_->task_cgroups().empty());
  // The pool settles: two sandboxes again, for the namespaces last asked for (with a
  // private network, new ones; with the host's, the one the start was given replaced).
  std::vector<std::string> now;
  auto kept = [&] {
    return std::count_if(now.begin(), now.end(), [&](const std::string& id) {
      return std::count(sandboxes.begin(), sandboxes.end(), id) > 0;
    });
  };
  for (int i = 0; i < 500; ++i, sleep_ms(10)) {
    now = agent_->sandbox_ids();
    if (now.size() == 2 && kept() == (private_net ? 0 : 1)) break;
  }
  ASSERT_EQ(now.size(), 2u);
  ASSERT_EQ(kept(), private_net ? 0 : 1) << "the pool did not settle";
  auto dirs = list_dir(agent_->dir() + "/state/tasks");
  ASSERT_TRUE(dirs.ok());
  for (const auto& d : *dirs)  // only the ready sandboxes' directories are left
    EXPECT_EQ(std::count(now.begin(), now.end(), d), 1) << "left behind: " << d;
  // Every sandbox no longer ready (the one the start was given, those of namespaces no
  // longer asked for) is gone with its cgroup.
  for (const auto& sb : sandboxes)
    EXPECT_EQ(path_exists(agent_->task_cgroup(sb)), std::count(now.begin(), now.end(), sb) > 0)
        << sb;
  std::string id = run(spec);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(agent_->wait_state(id, "running")["state"], "running");
  agent_->call("task.stop", {{"id", id}});
  agent_->wait_state(id, "stopped");
  EXPECT_TRUE(agent_->task_cgroups().empty());
}
INSTANTIATE_TEST_SUITE_P(Lifecycle, FailAt,
                         ::testing::Values(std::tuple{"start.cgroup", false},
                                           std::tuple{"start.cgroup", true},
                                           std::tuple{"start.handoff", false},  // a sandbox's
                                           std::tuple{"start.spawn", true}),    // its own
                         FailAt::name_of);

// A restart that fails part-way: the task is failed with the reason, and its cgroup and
// namespace are gone.
TEST_F(AgentRoot, ARestartThatFailsPartWayFailsTheTaskAndLeavesNoCgroup) {
  agent_->terminate();
  agent_->start("", "start.spawn#2");
  std::string id = run({{"name", "again"},
                        {"argv", {"sh", "-c", "exit 1"}},
                        {"namespaces", {{"network", "private"}}},
                        {"restart", {{"policy", "always"}, {"delay", "50ms"}}}});
  ASSERT_FALSE(id.empty());
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_NE(t.value("reason", "").find("restart failed: injected failure at start.spawn"),
            std::string::npos)
      << t.dump();
  EXPECT_TRUE(agent_->task_cgroups().empty());
}

class CrashAtExit : public AgentRoot, public ::testing::WithParamInterface<const char*> {};

TEST_P(CrashAtExit, ExitIsNeverLost) {
  agent_->terminate();
  agent_->start(GetParam());
  json r =
      agent_->call("task.run", {{"name", "ending"}, {"argv", {"sh", "-c", "sleep 0.3; exit 5"}}});
  std::string id = r["id"];
  ASSERT_TRUE(agent_->wait_dead()) << "agent did not crash at " << GetParam();
  agent_->start();
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["state"], "failed");
  EXPECT_EQ(t["exit_code"], 5);
  EXPECT_EQ(agent_->call("task.ls", json::object())["tasks"].size(), 1u);
  EXPECT_TRUE(agent_->task_cgroups().empty());
}
INSTANTIATE_TEST_SUITE_P(Lifecycle, CrashAtExit,
                         ::testing::Values("exit.cgroup-removed", "exit.recorded"));

TEST_F(AgentRoot, CrashDuringStopStillStops) {
  agent_->terminate();
  agent_->start("stop.signalled");
  std::string id =
      run({{"name", "stubborn"},
           {"stop_grace", "500ms"},
           {"argv", {"sh", "-c", "trap '' TERM; echo trapped; while true; do sleep 1; done"}}});
  // The trap is installed before the stop (a fixed wait lost that race on a busy machine).
  agent_->wait_task(id, [&](const json&) { return logs(id) == "trapped\n"; });
  ASSERT_EQ(logs(id), "trapped\n");
  EXPECT_FALSE(agent_->try_call("task.stop", {{"id", id}}).ok());
  ASSERT_TRUE(agent_->wait_dead());
  agent_->start();
  json t = agent_->wait_state(id, "stopped");
  EXPECT_EQ(t["signal"], "SIGKILL");  // the grace deadline survived the crash
  EXPECT_TRUE(agent_->task_cgroups().empty());
}

// Readiness checks. The task has a network namespace of its own: the check's socket is
// made in it (nothing answers on the host's loopback port).
TEST_F(AgentRoot, HttpAndTcpReadinessFollowTheTasksListener) {
  if (!path_exists("/bin/busybox")) GTEST_FAIL() << "busybox-static is needed (scripts/setup.sh)";
  std::string www = agent_->dir() + "/www";
  ASSERT_TRUE(mkdir_p(www).ok());
  auto task = [&](const std::string& name, json check) {
    return run({{"name", name},
                {"namespaces", {{"network", "private"}}},
                {"readiness", check},
                {"argv",
                 {"/bin/busybox", "sh", "-c",
                  "sleep 1; exec /bin/busybox httpd -f -p 127.0.0.1:8123 -h " + www}}});
  };
  std::string http = task("http-ready", {{"type", "http"},
                                         {"port", 8123},
                                         {"path", "/ready"},
                                         {"interval", "200ms"},
                                         {"timeout", "500ms"},
                                         {"failure_threshold", 2}});
  std::string tcp = task("tcp-ready", {{"type", "tcp"}, {"port", 8123}, {"interval", "200ms"}});
  json t = agent_->wait_state(http, "running");
  EXPECT_FALSE(t["ready"]) << t.dump();
  // The server listens after a second: tcp passes; http gets 404 until the file exists.
  json tt = agent_->wait_task(tcp, [](const json& j) { return j.value("ready", false); });
  EXPECT_TRUE(tt["ready"]) << tt.dump();
  t = agent_->wait_task(
      http, [](const json& j) { return j["readiness"].value("last_failure", "") == "HTTP 404"; });
  EXPECT_FALSE(t["ready"]) << t.dump();
  ASSERT_TRUE(write_file(www + "/ready", "yes\n").ok());
  t = agent_->wait_task(http, [](const json& j) { return j.value("ready", false); });
  EXPECT_TRUE(t["ready"]) << t.dump();
  // The host's loopback has no such server: the checks ran in the task's namespace.
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(8123);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::close(s);
  // Failing twice in a row: not ready any more.
  ASSERT_EQ(::unlink((www + "/ready").c_str()), 0);
  t = agent_->wait_task(http, [](const json& j) { return !j.value("ready", true); });
  EXPECT_FALSE(t["ready"]) << t.dump();
  EXPECT_EQ(t["readiness"]["last_failure"], "HTTP 404") << t.dump();
  EXPECT_EQ(t["state"], "running");
  agent_->call("task.stop", {{"id", http}});
  agent_->call("task.stop", {{"id", tcp}});
  t = agent_->wait_state(http, "stopped");
  EXPECT_FALSE(t["ready"]);
}

// An exec check runs inside the task: its root, its user, its cgroup; a check that
// hangs is killed at its timeout and leaves nothing behind.
// Issue 32 (11): --check-config accepted a default_task_user this machine does not have
// (every task's start then failed).
TEST_F(AgentRoot, CheckConfigKnowsTheDefaultTaskUser) {
  std::string conf = agent_->dir() + "/check.toml";
  auto check = [&](const std::string& user) {
    EXPECT_TRUE(
        write_file(conf, "socket = \"" + agent_->dir() + "/c.sock\"\nstate_dir = \"" +
                             agent_->dir() + "/c\"\ncgroup_root = \"" + agent_->cgroup_root() +
                             "\"\ninit_path = \"" WEFT_INIT_BIN "\"\ndefault_task_user = \"" +
                             user + "\"\n")
            .ok());
    int rc = std::system(
        (std::string(WEFT_AGENT_BIN) + " --check-config -c " + conf + " >/dev/null 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  EXPECT_EQ(check("nobody"), 0);
  EXPECT_EQ(check("no-such-user-weft"), 2);
}

TEST_F(AgentRoot, ExecReadinessRunsInsideTheTask) {
  if (!path_exists("/bin/busybox")) GTEST_FAIL() << "busybox-static is needed (scripts/setup.sh)";
  std::string rootfs = agent_->dir() + "/rootfs";
  ASSERT_TRUE(mkdir_p(rootfs + "/bin").ok());
  ASSERT_EQ(system(("cp /bin/busybox " + rootfs + "/bin/busybox").c_str()), 0);
  ASSERT_EQ(symlink("busybox", (rootfs + "/bin/sh").c_str()), 0);
  ASSERT_TRUE(write_file(rootfs + "/marker", "inside\n").ok());
  std::string id = run({{"name", "exec-ready"},
                        {"rootfs", rootfs},
                        {"user", "65534"},
                        {"group", "65534"},
                        {"readiness",
                         {{"type", "exec"},
                          {"command",
                           {"/bin/busybox", "sh", "-c",
                            "test -f /marker && test \"$(/bin/busybox id -u)\" = 65534 && "
                            "test \"$(/bin/busybox cat /proc/1/comm)\" = weft-init"}},
                          {"interval", "200ms"},
                          {"failure_threshold", 1}}},
                        {"argv", {"/bin/busybox", "sleep", "1000"}}});
  json t = agent_->wait_task(id, [](const json& j) { return j.value("ready", false); });
  ASSERT_TRUE(t["ready"]) << t.dump();
  // The marker exists only in the task's root: removed there, the check fails.
  ASSERT_EQ(::unlink((rootfs + "/marker").c_str()), 0);
  t = agent_->wait_task(id, [](const json& j) { return !j.value("ready", true); });
  EXPECT_EQ(t["readiness"]["last_failure"], "exit status 1") << t.dump();
  agent_->call("task.stop", {{"id", id}});
  agent_->wait_state(id, "stopped");

  std::string hang = run({{"name", "exec-hangs"},
                          {"readiness",
                           {{"type", "exec"},
                            {"command", {"/bin/sleep", "60"}},
                            {"interval", "100ms"},
                            {"timeout", "200ms"}}},
                          {"argv", {"sleep", "1000"}}});
  t = agent_->wait_task(hang, [](const json& j) {
    return j["readiness"].value("last_failure", "").find("timed out") == 0;
  });
  EXPECT_FALSE(t["ready"]) << t.dump();
  // Between checks only the task is in its cgroup (weft-init and sleep): every check was
  // killed with its command.
  bool only_task = false;
  for (int i = 0; i < 50 && !only_task; ++i) {
    auto procs = read_file(agent_->task_cgroup(hang) + "/cgroup.procs");
    ASSERT_TRUE(procs.ok());
    size_t n = 0;
    for (const auto& l : split(trim(*procs), '\n')) n += !l.empty();
    only_task = n == 2;
    if (!only_task) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(only_task);
  agent_->call("task.stop", {{"id", hang}});
  agent_->wait_state(hang, "stopped");
  // No sleep 60 left anywhere.
  EXPECT_NE(system("pgrep -x -f '/bin/sleep 60' >/dev/null"), 0);

  // Issue 32: a check whose command starts children (a shell running sleep) took only
  // the shell with it; one sleep stayed per interval. Each check now ends with all it
  // started, at its timeout and when its command exits leaving a child behind.
  std::string forks = run({{"name", "exec-forks"},
                           {"readiness",
                            {{"type", "exec"},
                             {"command", {"/bin/sh", "-c", "sleep 61 & sleep 62; true"}},
                             {"interval", "100ms"},
                             {"timeout", "200ms"}}},
                           {"argv", {"sleep", "1000"}}});
  int timeouts = 0;
  for (int i = 0; i < 200 && timeouts < 4; ++i) {
    t = agent_->call("task.show", {{"id", forks}});
    if (t["readiness"].value("last_failure", "").find("timed out") == 0) ++timeouts;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(timeouts, 3) << t.dump();
  int left = 0;
  for (int i = 0; i < 50; ++i) {  // between checks: none of the checks' sleeps
    left = system("test $(pgrep -c -f '^sleep 6[12]$') -le 2") == 0 ? 0 : 1;
    if (left == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(left, 0) << "checks left their children behind";
  agent_->call("task.stop", {{"id", forks}});
  agent_->wait_state(forks, "stopped");
  EXPECT_NE(system("pgrep -f '^sleep 6[12]$' >/dev/null"), 0)
      << "a check's child outlived its task";
  EXPECT_FALSE(path_exists(agent_->task_cgroup(forks))) << "the task's cgroup stayed";
}

// ---- sandboxes made ahead (agent/sandbox_pool.h)

class SandboxRoot : public AgentRoot {
 protected:
  // Waits until the agent has `n` sandboxes ready, none of them in `not_these`.
  std::vector<std::string> ready_sandboxes(size_t n,
                                           const std::vector<std::string>& not_these = {}) {
    std::vector<std::string> ids;
    for (int i = 0; i < 500; ++i, sleep_ms(10)) {
      ids = agent_->sandbox_ids();
      bool fresh = std::none_of(ids.begin(), ids.end(), [&](const std::string& id) {
        return std::count(not_these.begin(), not_these.end(), id) > 0;
      });
      if (ids.size() == n && fresh) return ids;
    }
    ADD_FAILURE() << "the agent did not make " << n << " new sandboxes";
    return ids;
  }
  static bool handed_off(const json& run_reply) {
    return run_reply.contains("start_phases_us") &&
           run_reply["start_phases_us"].contains("handoff");
  }
};

TEST_F(SandboxRoot, ATaskTakesASandboxAndRunsAsItsSpecSays) {
  std::vector<std::string> before = ready_sandboxes(2);
  for (const auto& id : before) {  // waiting in a cgroup of the task tree, nothing else
    auto procs = read_file(agent_->task_cgroup(id) + "/cgroup.procs");
    ASSERT_TRUE(procs.ok());
    EXPECT_EQ(split(trim(*procs), '\n').size(), 1u) << *procs;
  }
  if (!path_exists("/bin/busybox"))
    GTEST_SKIP() << "busybox-static is not installed (scripts/setup.sh installs it)";
  std::string rootfs = agent_->dir() + "/rootfs";  // files need a root of the task's own
  ASSERT_TRUE(mkdir_p(rootfs + "/bin").ok());
  ASSERT_EQ(system(("cp /bin/busybox " + rootfs + "/bin/busybox").c_str()), 0);
  ASSERT_EQ(symlink("busybox", (rootfs + "/bin/sh").c_str()), 0);
  // A limit of a controller this machine has (on a hybrid layout, hugetlb only).
  json info = agent_->call("agent.info", json::object());
  auto has = [&](const char* key, const char* v) {
    for (const auto& c : info[key])
      if (c == v) return true;
    return false;
  };
  json resources;
  std::string limit_file, limit_value;
  if (has("controllers", "memory")) {
    resources = {{"memory_max", "64M"}};
    limit_file = "memory.max", limit_value = "67108864";
  } else if (has("controllers", "hugetlb") && has("hugepage_sizes", "2MB")) {
    resources = {{"hugetlb", {{"2M", "8M"}}}};
    limit_file = "hugetlb.2MB.max", limit_value = "8388608";
  } else {
    GTEST_SKIP() << "neither the memory nor the hugetlb controller (2MB) is delegated here";
  }
  json r = agent_->call(
      "task.run",
      {{"name", "warm"},
       {"rootfs", rootfs},
       {"hostname", "warm-box"},
       {"user", "nobody"},
       {"env", {{"GREETING", "hello"}}},
       {"resources", resources},
       {"files", {{{"path", "/tmp/weft-sandbox-test-file"}, {"content", "file body"}}}},
       {"argv",
        {"/bin/sh", "-c",
         "echo pid=$$; hostname; echo $GREETING; id -u; cat /tmp/weft-sandbox-test-file; "
         "echo; ls /proc/self/fd | wc -l; "
         // It ends when the test has read its limit (its cgroup goes with it).
         "while [ ! -e /go ]; do /bin/busybox sleep 0.02; done; exit 3"}}});
  ASSERT_TRUE(handed_off(r)) << r.dump();
  std::string id = r["id"];
  EXPECT_EQ(std::count(before.begin(), before.end(), id), 1) << id << " is not a sandbox's id";
  // The task's limits were written into the sandbox's cgroup before it was handed over.
  EXPECT_EQ(trim(read_file(agent_->task_cgroup(id) + "/" + limit_file).value_or("")), limit_value);
  ASSERT_TRUE(write_file(rootfs + "/go", "").ok());
  json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["exit_code"], 3) << logs(id, "stderr");
  std::string out = logs(id);
  EXPECT_NE(out.find("pid=2\n"), std::string::npos) << out;                   // weft-init is pid 1
  EXPECT_NE(out.find("warm-box\nhello\n65534\n"), std::string::npos) << out;  // nobody
  EXPECT_NE(out.find("file body\n"), std::string::npos) << out;
  // stdin, stdout, stderr and ls's own directory: no descriptor of the hand-off leaks.
  EXPECT_NE(out.find("\n4\n"), std::string::npos) << out;
  EXPECT_FALSE(path_exists(agent_->task_cgroup(id)));  // removed at exit, as any task's
  // The pool is made up again, with new ids.
  std::vector<std::string> after = ready_sandboxes(2, {id});
  EXPECT_EQ(std::count(after.begin(), after.end(), id), 0);
}

TEST_F(SandboxRoot, ThePoolFollowsTheNamespacesAskedFor) {
  std::vector<std::string> host_net = ready_sandboxes(2);
  json spec = {{"namespaces", {{"network", "private"}}},
               {"argv", {"sh", "-c", "grep -c 127.0.0.1 /proc/net/fib_trie; cat /proc/net/dev"}}};
  spec["name"] = "first-private";
  json first = agent_->call("task.run", spec);
  EXPECT_FALSE(handed_off(first)) << "no sandbox had a network namespace of its own";
  // The pool replaces the host-network sandboxes with private-network ones.
  ready_sandboxes(2, host_net);
  spec["name"] = "second-private";
  json second = agent_->call("task.run", spec);
  ASSERT_TRUE(handed_off(second)) << second.dump();
  for (const json* r : {&first, &second}) {
    std::string id = (*r)["id"];
    json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
    EXPECT_EQ(t["exit_code"], 0) << logs(id, "stderr");
    std::string out = logs(id);
    EXPECT_NE(out.find("lo:"), std::string::npos) << out;
    EXPECT_EQ(out.find("eth"), std::string::npos) << out;  // nothing of the host's
    EXPECT_NE(out.rfind("0\n", 0), 0u) << "loopback is not up: " << out;
  }
}

TEST_F(SandboxRoot, ADeadSandboxFallsBackToTheUsualStart) {
  std::vector<std::string> ids = ready_sandboxes(2);
  for (const auto& id : ids)
    ASSERT_TRUE(write_file(agent_->task_cgroup(id) + "/cgroup.kill", "1").ok());
  sleep_ms(50);
  for (int i = 0; i < 2; ++i) {
    json r = agent_->call("task.run",
                          {{"name", "fallback-" + std::to_string(i)}, {"argv", {"echo", "ran"}}});
    EXPECT_FALSE(handed_off(r)) << r.dump();
    std::string id = r["id"];
    json t = agent_->wait_task(id, [&](const json& j) { return terminal(j); });
    EXPECT_EQ(t["exit_code"], 0) << logs(id, "stderr");
    EXPECT_EQ(logs(id), "ran\n");
  }
  ready_sandboxes(2, ids);  // and new ones are made
}

TEST_F(SandboxRoot, ACleanStopLeavesNoSandboxBehind) {
  std::vector<std::string> ids = ready_sandboxes(2);
  std::vector<int> pids;
  for (const auto& id : ids)
    pids.push_back(std::stoi(trim(read_file(agent_->task_cgroup(id) + "/cgroup.procs").value())));
  for (const auto& id : ids)  // made ahead with the sandbox
    EXPECT_TRUE(path_exists(agent_->dir() + "/state/tasks/" + id + "/logs")) << id;
  agent_->terminate();
  for (const auto& id : ids) {
    EXPECT_FALSE(path_exists(agent_->task_cgroup(id))) << id;
    EXPECT_FALSE(path_exists(agent_->dir() + "/state/tasks/" + id)) << id;
  }
  for (int pid : pids) EXPECT_NE(::kill(pid, 0), 0) << "sandbox " << pid << " outlived the agent";
  agent_->start();
}

// A package upgrade replaces weft-init while the agent runs: sandboxes that run the old
// binary are not handed the new agent's argv; they are replaced.
TEST_F(SandboxRoot, AReplacedWeftInitRetiresTheSandboxesRunningTheOldOne) {
  agent_->terminate();
  std::string init = agent_->dir() + "/weft-init";
  ASSERT_EQ(system(("cp " WEFT_INIT_BIN " " + init).c_str()), 0);
  std::string conf_path = agent_->dir() + "/agent.toml";
  std::string conf = read_file(conf_path).value();
  size_t at = conf.find("init_path = \"" WEFT_INIT_BIN "\"");
  ASSERT_NE(at, std::string::npos) << conf;
  conf.replace(at, std::string("init_path = \"" WEFT_INIT_BIN "\"").size(),
               "init_path = \"" + init + "\"");
  ASSERT_TRUE(write_file(conf_path, conf).ok());
  agent_->start();
  std::vector<std::string> old = ready_sandboxes(2);
  // The new binary: same bytes, a new file (as dpkg installs one).
  ASSERT_EQ(system(("cp " + init + " " + init + ".new && mv " + init + ".new " + init).c_str()), 0);
  json r = agent_->call("task.run", {{"name", "after-upgrade"}, {"argv", {"echo", "ran"}}});
  EXPECT_FALSE(handed_off(r)) << r.dump();
  EXPECT_EQ(std::count(old.begin(), old.end(), r["id"].get<std::string>()), 0);
  json t = agent_->wait_task(r["id"], [&](const json& j) { return terminal(j); });
  EXPECT_EQ(t["exit_code"], 0) << logs(r["id"], "stderr");
  for (const auto& id : old) EXPECT_FALSE(path_exists(agent_->task_cgroup(id))) << id;
  ready_sandboxes(2, old);
  json again = agent_->call("task.run", {{"name", "with-new"}, {"argv", {"echo", "ran"}}});
  EXPECT_TRUE(handed_off(again)) << again.dump();
  EXPECT_EQ(agent_->wait_state(again["id"], "exited")["exit_code"], 0);
}

TEST_F(SandboxRoot, PoolOffMakesNone) {
  agent_->terminate();
  agent_->add_config("sandbox_pool = 0");
  agent_->start();
  sleep_ms(200);
  EXPECT_TRUE(agent_->sandbox_ids().empty());
  json r = agent_->call("task.run", {{"name", "cold"}, {"argv", {"true"}}});
  EXPECT_FALSE(handed_off(r)) << r.dump();
  EXPECT_EQ(agent_->wait_state(r["id"], "exited")["exit_code"], 0);
}

// Issue 32, finding 2: tasks ran as nobody, so any other task (or host process) running
// as nobody read a task's environment through /proc/PID/environ. Each task now has a uid
// and gid of its own from agent.toml's task_uids: distinct from every other live task's,
// kept across an agent restart, handed out in turn (a freed uid is not the next one).
TEST(AgentOwnUids, EachTaskHasAUidOfItsOwnKeptAcrossAnAgentRestart) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  AgentHarness agent(/*root_tasks=*/false);  // agent.toml names no default_task_user
  agent.start();
  auto run = [&](json spec) { return agent.call("task.run", spec).value("id", ""); };
  auto log_of = [&](const std::string& id) {
    return agent.call("task.logs", {{"id", id}, {"stream", "stdout"}}).value("data", "");
  };
  // The task's own process (weft-init's child) in its cgroup, once it runs as `uid`
  // (between its fork and its exec it is still weft-init's, root's).
  auto task_pid = [&](const std::string& id, long uid) {
    json t = agent.wait_state(id, "running");
    std::string init = std::to_string(t.value("pid", 0));
    for (int i = 0; i < 500; ++i) {
      auto procs = read_file(agent.task_cgroup(id) + "/cgroup.procs");
      if (procs.ok())
        for (const auto& p : split(trim(*procs), '\n')) {
          if (p.empty() || p == init) continue;
          auto status = read_file("/proc/" + p + "/status").value_or("");
          std::string u = std::to_string(uid);
          if (status.find("Uid:\t" + u + "\t") != std::string::npos &&
              status.find("Gid:\t" + u + "\t") != std::string::npos &&
              status.find("Name:\tsleep") != std::string::npos)
            return p;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::string();
  };
  // Prints the reader's uid and whether it could read `pid`'s environment.
  auto peek = [&](const std::string& name, const std::string& pid, json extra) {
    json spec{{"name", name},
              {"namespaces", {{"pid", false}}},
              {"argv",
               {"sh", "-c",
                "id -u; if cat /proc/" + pid +
                    "/environ >/dev/null 2>&1; then echo READ; "
                    "else echo DENIED; fi"}}};
    spec.update(extra);
    std::string id = run(spec);
    agent.wait_state(id, "exited");
    return log_of(id);
  };
  json secret_env{{"DB_PASSWORD", "hunter2"}};
  std::string a = run({{"name", "a"}, {"env", secret_env}, {"argv", {"sleep", "1000"}}});
  std::string b = run({{"name", "b"}, {"argv", {"sleep", "1000"}}});
  json ta = agent.wait_state(a, "running"), tb = agent.wait_state(b, "running");
  ASSERT_TRUE(ta.contains("uid") && tb.contains("uid")) << ta.dump() << tb.dump();
  long ua = ta["uid"], ub = tb["uid"];
  EXPECT_NE(ua, ub);
  for (long u : {ua, ub}) {
    EXPECT_GE(u, 3000000);
    EXPECT_LE(u, 3065535);
  }
  // Its program runs as that uid, with the gid of the same number.
  std::string pid_a = task_pid(a, ua);
  ASSERT_FALSE(pid_a.empty()) << "task a never ran sleep as uid and gid " << ua;
  // Another task cannot read its environment...
  std::string denied = peek("peek", pid_a, json::object());
  EXPECT_NE(denied.find("DENIED"), std::string::npos) << denied;
  // ...where two tasks of one named user could (what the review found, and the control
  // that shows this check can fail).
  std::string shared = run(
      {{"name", "shared"}, {"user", "65534"}, {"env", secret_env}, {"argv", {"sleep", "1000"}}});
  std::string pid_shared = task_pid(shared, 65534);
  ASSERT_FALSE(pid_shared.empty());
  std::string read = peek("peek-nobody", pid_shared, {{"user", "65534"}});
  EXPECT_NE(read.find("READ"), std::string::npos) << read;
  EXPECT_FALSE(agent.call("task.show", {{"id", shared}}).contains("uid"));

  // A restarted agent keeps each task's uid and gives a new task another.
  agent.kill9();
  agent.start();
  EXPECT_EQ(agent.wait_state(a, "running")["uid"], ua);
  EXPECT_EQ(agent.wait_state(b, "running")["uid"], ub);
  std::string c = run({{"name", "c"}, {"argv", {"sleep", "1000"}}});
  long uc = agent.wait_state(c, "running")["uid"];
  EXPECT_NE(uc, ua);
  EXPECT_NE(uc, ub);
  // A removed task's uid is not the next one handed out.
  agent.call("task.stop", {{"id", a}, {"grace", 1}});
  agent.wait_state(a, "stopped");
  agent.call("task.remove", {{"id", a}});
  std::string d = run({{"name", "d"}, {"argv", {"sleep", "1000"}}});
  long ud = agent.wait_state(d, "running")["uid"];
  EXPECT_NE(ud, ua);
  EXPECT_NE(ud, ub);
  EXPECT_NE(ud, uc);
  for (const auto& id : {b, c, d, shared}) agent.call("task.stop", {{"id", id}, {"grace", 1}});
  for (const auto& id : {b, c, d, shared}) agent.wait_state(id, "stopped");
}

}  // namespace
}  // namespace weft::testing
