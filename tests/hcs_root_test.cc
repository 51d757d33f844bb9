// weft-hcs as a process: verdicts with hysteresis through the API, state across a
// restart, and the kernel log read from the real /dev/kmsg.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/clock.h"
#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "hcs/kernel_probes.h"
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
  // extra: more hcs.toml lines. new_netns: run in a private network namespace after
  // `setup` (a shell command, e.g. creating veths) ran there. Liveness of the other
  // daemons is off unless the test configures it.
  void start(const std::string& extra, bool new_netns = false, const std::string& setup = "") {
    bool own_interval =
        extra.rfind("interval", 0) == 0 || extra.find("\ninterval") != std::string::npos;
    std::string conf = "socket = \"" + dir_ + "/hcs.sock\"\nstate_dir = \"" + dir_ + "/state\"\n" +
                       (own_interval ? "" : "interval = \"200ms\"\n") + extra +
                       "\n[liveness]\nagent_socket = \"\"\nsidekick_socket = \"\"\n";
    ASSERT_TRUE(write_file(dir_ + "/hcs.toml", conf).ok());
    testing::SpawnOptions o;
    o.log = dir_ + "/hcs.log";
    o.prepare = [&] {
      // sysfs shows the links of the network namespace that mounted it: a private mount
      // namespace with a fresh /sys lets /sys/class/net show this namespace's links.
      if (new_netns &&
          (unshare(CLONE_NEWNET | CLONE_NEWNS) != 0 ||
           mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
           mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0))
        return false;
      return setup.empty() || std::system(setup.c_str()) == 0;
    };
    pid_ = testing::spawn_process({WEFT_HCS_BIN, "-c", dir_ + "/hcs.toml"}, o);
    for (int i = 0; i < 1000; ++i) {
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

// Runs a command in the network namespace of `pid`; returns its exit status.
int in_netns(pid_t pid, const std::string& cmd) {
  return std::system(
      ("nsenter -t " + std::to_string(pid) + " -n " + cmd + " >/dev/null 2>&1").c_str());
}

// A veth whose peer goes down inside a private network namespace: the link probe sees the
// carrier loss through rtnetlink and reaches FAILED by fast confirmation, long before the
// (30 s) probe interval would have taken a second sample; the peer coming back recovers it.
TEST_F(Hcs, VethCarrierLossInAPrivateNetns) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  start(
      "interval = \"30s\"\nconfirm_interval = \"500ms\"\nkmsg = false\nlink = [\"hv0\"]\n"
      "[[disk]]\npath = \"/\"\nmin_free_pct = 0\nmin_inodes_pct = 0\n"
      "[hysteresis]\nfail_after = 3\nrecover_after = 1\nhold_down = \"0s\"\n",
      /*new_netns=*/true,
      "ip link add hv0 type veth peer name hv1 && ip link set hv0 up && ip link set hv1 up");
  if (HasFatalFailure()) return;
  wait_probe("link:hv0", "ok");
  uint64_t t0 = now_monotonic_us();
  ASSERT_EQ(in_netns(pid_, "ip link set hv1 down"), 0);
  json p;
  for (int i = 0; i < 200; ++i) {  // 10 s: a third of one interval
    p = probe("link:hv0");
    if (p.value("state", "") == "failed") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(p.value("state", ""), "failed") << p.dump();
  double secs = static_cast<double>(now_monotonic_us() - t0) / 1e6;
  RecordProperty("carrier_loss_to_failed_s", std::to_string(secs));
  EXPECT_NE(p["detail"].get<std::string>().find("carrier"), std::string::npos) << p.dump();
  ASSERT_EQ(in_netns(pid_, "ip link set hv1 up"), 0);
  for (int i = 0; i < 200; ++i) {
    p = probe("link:hv0");
    if (p.value("state", "") == "ok") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(p.value("state", ""), "ok") << p.dump();
  EXPECT_GE(p["metrics"].value("changes_in_window", 0), 2) << p.dump();
}

// The memory cgroup to make a real OOM kill in: cgroup v1's memory hierarchy on a hybrid
// host (this machine's cgroup2 has no memory controller), or cgroup2 where it has one.
struct OomCgroup {
  std::string dir, limit_file;
  static std::optional<OomCgroup> make() {
    std::string name = "weft-oomtest-" + random_hex(4);
    if (path_exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
      return OomCgroup{"/sys/fs/cgroup/memory/" + name, "memory.limit_in_bytes"};
    auto ctl = read_file("/sys/fs/cgroup/cgroup.controllers");
    if (ctl.ok() && ctl->find("memory") != std::string::npos)
      return OomCgroup{"/sys/fs/cgroup/" + name, "memory.max"};
    return std::nullopt;
  }
};

// A child in `cg` that touches 256 MiB against a 32 MiB limit: killed by the OOM killer.
pid_t oom_victim(const std::string& cg) {
  pid_t pid = fork();
  if (pid == 0) {
    if (!write_file(cg + "/cgroup.procs", "0").ok()) _exit(3);
    std::vector<char*> blocks;
    for (int i = 0; i < 256; ++i) {
      char* b = static_cast<char*>(malloc(1 << 20));
      if (!b) _exit(4);
      memset(b, 1, 1 << 20);
      blocks.push_back(b);
    }
    _exit(0);  // not killed: the limit did not hold
  }
  return pid;
}

// The eBPF probes load on this kernel and count real events: a memory-cgroup OOM kill
// (told from a machine-wide one, with the victim's pid and cgroup), TCP retransmissions
// and packet drops with their reason, all from a private network namespace.
TEST(HcsBpf, ProbesLoadAndCountRealEvents) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
#if !WEFT_HAVE_BPF
  if (std::getenv("WEFT_REQUIRE_ROOT_TESTS")) FAIL() << "built without the eBPF probes";
  GTEST_SKIP() << "built without the eBPF probes";
#endif
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  hcs::KernelProbeConfig cfg;
  hcs::OomProbe oom(HostPaths("/"), cfg);
  ASSERT_EQ(oom.attach(**loop, nullptr), "bpf");
  hcs::RateProbe tcp(hcs::RateProbe::Kind::kTcpRetransmits, HostPaths("/"), cfg);
  ASSERT_EQ(tcp.attach(), "bpf");
  hcs::RateProbe drops(hcs::RateProbe::Kind::kNetDrops, HostPaths("/"), cfg);
  ASSERT_EQ(drops.attach(), "bpf");

  // A real memory-cgroup OOM kill.
  auto cg = OomCgroup::make();
  ASSERT_TRUE(cg) << "no memory cgroup controller to make an OOM kill in";
  ASSERT_TRUE(mkdir_p(cg->dir).ok());
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      for (int i = 0; i < 200 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } cleanup{cg->dir};
  ASSERT_TRUE(write_file(cg->dir + "/" + cg->limit_file, std::to_string(32 << 20)).ok());
  pid_t victim = oom_victim(cg->dir);
  int st = 0;
  ASSERT_EQ(waitpid(victim, &st, 0), victim);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
      << "the victim was not OOM-killed: " << st;
  hcs::Sample s = oom.run(now_realtime_us());
  EXPECT_EQ(s.metrics["source"], "bpf");
  EXPECT_GE(s.metrics["memcg_kills_window"].get<int>(), 1) << s.metrics.dump();
  EXPECT_EQ(s.health, hcs::Health::kOk) << "a container OOM is not the machine's failure";
  bool found = false;
  for (const auto& v : s.metrics["recent_victims"])
    found |= v["pid"] == victim && v["kind"] == "memcg" &&
             v["cgroup"] == cg->dir.substr(cg->dir.rfind('/') + 1);
  EXPECT_TRUE(found) << s.metrics.dump();

  // Retransmitted SYNs and dropped packets, in a private network namespace: a SYN to an
  // address nobody answers ARP for is retransmitted after 1 s; datagrams to a closed
  // port on loopback are dropped with reason no_socket.
  pid_t net = fork();
  if (net == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(2);
    if (std::system("ip link set lo up && ip link add v0 type veth peer name v1 && "
                    "ip addr add 10.99.0.1/24 dev v0 && ip link set v0 up && ip link set v1 up") !=
        0)
      _exit(3);
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 50; ++i) sendto(u, "x", 1, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
    int t = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(80);
    inet_pton(AF_INET, "10.99.0.2", &dst.sin_addr);
    connect(t, reinterpret_cast<sockaddr*>(&dst), sizeof dst);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    _exit(0);
  }
  ASSERT_EQ(waitpid(net, &st, 0), net);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  uint64_t now = now_realtime_us();
  s = tcp.run(now);
  EXPECT_EQ(s.metrics["source"], "bpf");
  EXPECT_GE(s.metrics["total"].get<uint64_t>(), 1u) << s.metrics.dump();
  s = drops.run(now);
  EXPECT_GE(s.metrics["top_since_last_sample"].value("no_socket", 0), 50) << s.metrics.dump();
}

}  // namespace
}  // namespace weft::testing
