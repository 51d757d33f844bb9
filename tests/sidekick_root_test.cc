// weft-sidekick as a process: the API and weftctl-facing behaviour end to end against a
// fake /proc and /sys tree, crash recovery across a real SIGKILL, re-application at
// start, and real net.* sysctls inside a private network namespace.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "tests/agent_harness.h"

namespace weft::testing {
namespace {

class Sidekick {
 public:
  Sidekick() {
    dir_ = std::filesystem::temp_directory_path() / ("weft-sk-test-" + random_hex(5));
    EXPECT_TRUE(mkdir_p(dir_ + "/profiles").ok());
    EXPECT_TRUE(mkdir_p(dir_ + "/host/cg").ok());
    EXPECT_TRUE(write_file(dir_ + "/host/cg/cgroup.subtree_control", "cpu memory\n").ok());
  }
  ~Sidekick() {
    stop(SIGKILL);
    (void)remove_tree(dir_);
  }
  void fake(const std::string& rel, const std::string& value) {
    ASSERT_TRUE(mkdir_p(dirname_of(dir_ + "/host/" + rel)).ok());
    ASSERT_TRUE(write_file(dir_ + "/host/" + rel, value).ok());
  }
  std::string host(const std::string& rel) {
    return trim(read_file(dir_ + "/host/" + rel).value_or("<missing>"));
  }
  void profile(const std::string& name, const std::string& text) {
    ASSERT_TRUE(write_file(dir_ + "/profiles/" + name + ".toml", text).ok());
  }
  // host_root: the fake tree, or "/" for the real kernel (inside a private netns).
  // setup: a shell command run in the child after it entered its new network namespace
  // (test only: creating veths). extra_conf: more sidekick.toml lines.
  void start(const std::string& host_root = "", const std::string& crash_after = "",
             bool new_netns = false, const std::string& setup = "",
             const std::string& extra_conf = "") {
    std::string root = host_root.empty() ? dir_ + "/host" : host_root;
    std::string conf = "socket = \"" + dir_ + "/sk.sock\"\nstate_dir = \"" + dir_ + "/state\"\n" +
                       "profile_dirs = [\"" + dir_ + "/profiles\"]\nhost_root = \"" + root +
                       "\"\n" + "workload_cgroup = \"" + dir_ +
                       "/host/cg\"\nlog_level = \"debug\"\n" + extra_conf;
    ASSERT_TRUE(write_file(dir_ + "/sidekick.toml", conf).ok());
    testing::SpawnOptions o;
    o.log = dir_ + "/sidekick.log";
    if (!crash_after.empty()) o.env["WEFT_SIDEKICK_CRASH_AFTER_WRITES"] = crash_after;
    o.prepare = [&] {
      if (new_netns && unshare(CLONE_NEWNET) != 0) return false;
      return setup.empty() || std::system(setup.c_str()) == 0;
    };
    pid_ = testing::spawn_process({WEFT_SIDEKICK_BIN, "-c", dir_ + "/sidekick.toml"}, o);
    for (int i = 0; i < 500; ++i) {
      if (call_ok("profile.active")) return;
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "weft-sidekick exited: " << read_file(dir_ + "/sidekick.log").value_or("");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "weft-sidekick did not answer";
  }
  // Returns the signal that ended it (0 for a clean exit).
  int stop(int sig = SIGTERM) {
    if (pid_ < 0) return -1;
    kill(pid_, sig);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  }
  int wait_exit() {
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  }
  Result<json> call(const std::string& method, const json& params = json::object()) {
    TRY_ASSIGN(auto c, rpc::Client::connect(dir_ + "/sk.sock"));
    return c->call(method, params, 20000);
  }
  bool call_ok(const std::string& method) { return call(method).ok(); }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

class SidekickProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    sk_.fake("proc/sys/net/core/somaxconn", "128\n");
    sk_.fake("proc/sys/vm/swappiness", "60\n");
    sk_.fake("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
    sk_.fake("proc/cmdline", "root=/dev/vda quiet\n");
    sk_.profile("web",
                "description = \"test web\"\n[sysctl]\n\"net.core.somaxconn\" = 4096\n"
                "\"vm.swappiness\" = 10\n[thp]\nenabled = \"always\"\n");
    sk_.profile("broken", "[sysctl]\n\"vm.swappiness\" = 10\n\"net.core.no_such\" = 1\n");
  }
  Sidekick sk_;
};

TEST_F(SidekickProcess, ApiSwitchVerifyOffHistory) {
  sk_.start();
  auto ls = sk_.call("profile.ls");
  ASSERT_TRUE(ls.ok()) << ls.error().str();
  EXPECT_EQ((*ls)["profiles"].size(), 2u);
  auto plan = sk_.call("profile.plan", {{"name", "web"}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)["changes"].size(), 3u);
  auto sw = sk_.call("profile.switch", {{"name", "web"}});
  ASSERT_TRUE(sw.ok()) << sw.error().str();
  EXPECT_EQ((*sw)["outcome"], "ok") << sw->dump();
  EXPECT_EQ(sk_.host("proc/sys/net/core/somaxconn"), "4096");
  EXPECT_EQ((*sk_.call("profile.active"))["profile"], "web");
  EXPECT_EQ((*sk_.call("profile.plan", {{"name", "web"}}))["changes"].size(), 0u);
  EXPECT_EQ((*sk_.call("profile.verify"))["exit_code"], 0);
  sk_.fake("proc/sys/vm/swappiness", "30\n");
  auto drift = sk_.call("profile.verify");
  EXPECT_EQ((*drift)["outcome"], "drift");
  EXPECT_EQ((*drift)["exit_code"], 5);
  // A failing required knob: nothing half-applied, the error names knob and line.
  auto bad = sk_.call("profile.switch", {{"name", "broken"}});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ((*bad)["outcome"], "failed");
  EXPECT_NE((*bad)["error"].get<std::string>().find("broken.toml:3"), std::string::npos)
      << bad->dump();
  EXPECT_EQ(sk_.host("proc/sys/vm/swappiness"), "30");
  EXPECT_EQ((*sk_.call("profile.active"))["profile"], "web");
  auto off = sk_.call("profile.off");
  EXPECT_EQ((*off)["outcome"], "ok");
  EXPECT_EQ(sk_.host("proc/sys/net/core/somaxconn"), "128");
  EXPECT_EQ(sk_.host("proc/sys/vm/swappiness"), "60");
  auto hist = sk_.call("profile.history");
  ASSERT_TRUE(hist.ok());
  EXPECT_GE((*hist)["switches"].size(), 3u);
  auto missing = sk_.call("profile.switch", {{"name", "nope"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, rpc::kNotFound);
  EXPECT_EQ(sk_.stop(), 0);
}

TEST_F(SidekickProcess, SigkillMidSwitchIsRolledBackAtRestart) {
  sk_.start("", "2");
  auto r = sk_.call("profile.switch", {{"name", "web"}});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(sk_.wait_exit(), SIGKILL);
  EXPECT_EQ(sk_.host("proc/sys/net/core/somaxconn"), "4096");  // one write landed
  sk_.start();
  EXPECT_EQ(sk_.host("proc/sys/net/core/somaxconn"), "128");
  EXPECT_EQ(sk_.host("proc/sys/vm/swappiness"), "60");
  EXPECT_TRUE((*sk_.call("profile.active"))["profile"].is_null());
  auto hist = sk_.call("profile.history");
  EXPECT_EQ((*hist)["switches"][0]["state"], "rolled-back");
}

TEST_F(SidekickProcess, ReappliesActiveProfileAtStart) {
  sk_.start();
  ASSERT_EQ((*sk_.call("profile.switch", {{"name", "web"}}))["outcome"], "ok");
  EXPECT_EQ(sk_.stop(), 0);
  // A reboot forgets runtime settings.
  sk_.fake("proc/sys/net/core/somaxconn", "128\n");
  sk_.fake("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
  sk_.start();
  EXPECT_EQ(sk_.host("proc/sys/net/core/somaxconn"), "4096");
  EXPECT_EQ(sk_.host("sys/kernel/mm/transparent_hugepage/enabled"), "always");
}

TEST(SidekickRealKernel, NetSysctlsInPrivateNetns) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  std::string host_before = trim(read_file("/proc/sys/net/core/somaxconn").value_or(""));
  Sidekick sk;
  sk.profile("net",
             "[sysctl]\n\"net.core.somaxconn\" = 1234\n\"net.ipv4.ip_forward\" = 1\n"
             "\"net.ipv4.tcp_rmem\" = \"4096 65536 1048576\"\n");
  sk.start("/", "", /*new_netns=*/true);
  auto plan = sk.call("profile.plan", {{"name", "net"}});
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  EXPECT_EQ((*plan)["changes"].size(), 3u) << plan->dump();
  auto sw = sk.call("profile.switch", {{"name", "net"}});
  ASSERT_TRUE(sw.ok());
  EXPECT_EQ((*sw)["outcome"], "ok") << sw->dump();
  // The kernel holds the values (nothing left to change) ...
  EXPECT_EQ((*sk.call("profile.plan", {{"name", "net"}}))["changes"].size(), 0u);
  EXPECT_EQ((*sk.call("profile.verify"))["outcome"], "ok");
  // ... in the private namespace only.
  EXPECT_EQ(trim(read_file("/proc/sys/net/core/somaxconn").value_or("")), host_before);
  auto off = sk.call("profile.off");
  EXPECT_EQ((*off)["outcome"], "ok") << off->dump();
  EXPECT_EQ((*sk.call("profile.plan", {{"name", "net"}}))["changes"].size(), 3u);
}

// Runs a command in the sidekick's network namespace; returns its output.
std::string in_netns(pid_t pid, const std::string& cmd) {
  std::string full = "nsenter -t " + std::to_string(pid) + " -n " + cmd + " 2>&1";
  std::string out;
  if (FILE* f = popen(full.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  return out;
}

// Links through netlink in a private network namespace: MTU, txqueuelen and channel
// counts of a veth pair, and a link that re-appears gets its settings again.
TEST(SidekickRealKernel, VethByNetlinkAndLinkEvents) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string make_veth =
      "ip link add wv0 numtxqueues 2 numrxqueues 2 type veth peer name wv1 numtxqueues 2 "
      "numrxqueues 2";
  Sidekick sk;
  // veth reports as many active queues as it was created with (2): ask for 1.
  sk.profile("nic",
             "[nic.\"wv*\"]\nmtu = 9000\ntxqueuelen = 5000\n"
             "[nic.\"wv0\"]\nchannels = { rx = 1, tx = 1 }\nfeatures = { \"rx-gro\" = true }\n"
             "[nic.\"wv1\"]\nrings = { rx = 512 }\nbest_effort = true\n");
  sk.start("/", "", /*new_netns=*/true, make_veth, "drift_policy = \"enforce\"\n");
  auto plan = sk.call("profile.plan", {{"name", "nic"}});
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  // mtu and txqueuelen of both ends, wv0's rx and tx channel counts and GRO; veth has no
  // rings, so wv1's best-effort ring size is planned but cannot be applied.
  EXPECT_EQ((*plan)["changes"].size(), 8u) << plan->dump();
  auto sw = sk.call("profile.switch", {{"name", "nic"}});
  ASSERT_TRUE(sw.ok());
  EXPECT_EQ((*sw)["outcome"], "degraded") << sw->dump();  // the ring size, best effort
  std::string link = in_netns(sk.pid(), "ip -d -o link show wv0");
  EXPECT_NE(link.find("mtu 9000"), std::string::npos) << link;
  EXPECT_NE(link.find("qlen 5000"), std::string::npos) << link;
  // Channels and GRO read back as set; the missing ring size is a best-effort miss.
  EXPECT_EQ((*sk.call("profile.verify"))["outcome"], "degraded");
  // The link goes away and comes back with kernel defaults: the link event brings the
  // profile back without waiting for the periodic verification.
  in_netns(sk.pid(), "ip link del wv0");
  in_netns(sk.pid(), make_veth);
  bool fixed = false;
  for (int i = 0; i < 50 && !fixed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fixed = in_netns(sk.pid(), "ip -o link show wv0").find("mtu 9000") != std::string::npos &&
            in_netns(sk.pid(), "ip -o link show wv1").find("mtu 9000") != std::string::npos;
  }
  EXPECT_TRUE(fixed) << in_netns(sk.pid(), "ip -o link");
  auto off = sk.call("profile.off");
  EXPECT_EQ((*off)["outcome"], "ok") << off->dump();
  EXPECT_NE(in_netns(sk.pid(), "ip -o link show wv0").find("mtu 1500"), std::string::npos);
  EXPECT_EQ((*sk.call("profile.plan", {{"name", "nic"}}))["changes"].size(), 8u);  // all back
}

// Host-wide: THP, IRQ affinity and the huge page pool of the real machine. Opt-in
// (WEFT_HOST_WIDE_TESTS=1, set by scripts/test.sh and CI); every value is saved first and
// restored after, by the sidekick's own `off` and again by the test whatever happens.
TEST(SidekickRealKernel, ThpIrqAffinityAndHugepages) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  if (!std::getenv("WEFT_HOST_WIDE_TESTS"))
    GTEST_SKIP() << "host-wide test (THP, IRQ affinity, huge pages): set WEFT_HOST_WIDE_TESTS=1";
  auto selected = [](const std::string& f) {
    std::string v = read_file(f).value_or("");
    auto a = v.find('['), b = v.find(']');
    return a == std::string::npos ? trim(v) : v.substr(a + 1, b - a - 1);
  };
  const std::string thp = "/sys/kernel/mm/transparent_hugepage/enabled";
  const std::string pool = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
  std::string irq;
  for (const auto& line : split(read_file("/proc/interrupts").value_or(""), '\n')) {
    if (line.find("virtio") != std::string::npos && line.find("-input") != std::string::npos) {
      irq = trim(line.substr(0, line.find(':')));
      break;
    }
  }
  ASSERT_FALSE(irq.empty()) << "no virtio NIC queue IRQ on this machine";
  const std::string aff = "/proc/irq/" + irq + "/smp_affinity_list";
  struct Saved {
    std::vector<std::pair<std::string, std::string>> v;
    ~Saved() {
      for (auto it = v.rbegin(); it != v.rend(); ++it) (void)write_file(it->first, it->second);
    }
  } saved;
  saved.v = {{thp, selected(thp)},
             {aff, trim(read_file(aff).value_or(""))},
             {pool, trim(read_file(pool).value_or(""))}};
  std::string thp_want = saved.v[0].second == "never" ? "madvise" : "never";
  std::string cpu_want = trim(read_file(aff).value_or("")) == "1" ? "0" : "1";
  uint64_t pages = std::stoull(saved.v[2].second) + 2;

  Sidekick sk;
  sk.profile("hw", "[thp]\nenabled = \"" + thp_want + "\"\n[irq.\"virtio*-input*\"]\ncpus = \"" +
                       cpu_want + "\"\n[hugepages]\n\"2M\" = " + std::to_string(pages) + "\n");
  sk.start("/");
  auto sw = sk.call("profile.switch", {{"name", "hw"}});
  ASSERT_TRUE(sw.ok()) << sw.error().str();
  EXPECT_EQ((*sw)["outcome"], "ok") << sw->dump();
  EXPECT_EQ(selected(thp), thp_want);
  EXPECT_EQ(trim(read_file(aff).value_or("")), cpu_want);
  EXPECT_EQ(trim(read_file(pool).value_or("")), std::to_string(pages));
  EXPECT_EQ((*sk.call("profile.verify"))["outcome"], "ok");
  auto off = sk.call("profile.off");
  EXPECT_EQ((*off)["outcome"], "ok") << off->dump();
  EXPECT_EQ(selected(thp), saved.v[0].second);
  EXPECT_EQ(trim(read_file(aff).value_or("")), saved.v[1].second);
  EXPECT_EQ(trim(read_file(pool).value_or("")), saved.v[2].second);
}

}  // namespace
}  // namespace weft::testing
