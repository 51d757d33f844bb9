// The kernel probes' procfs fallbacks against fake trees (the BPF paths are exercised on
// the real kernel by tests/hcs_root_test.cc), the PSI trigger check, liveness probes,
// and the configuration.
#include "hcs/kernel_probes.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <filesystem>
#include <thread>

#include "common/clock.h"
#include "common/fs.h"
#include "common/strings.h"
#include "hcs/hcs_conf.h"

namespace weft::hcs {
namespace {

// A real /proc/net/snmp from a 6.1 kernel, trimmed to the groups used.
const char* kSnmp =
    "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos "
    "InDiscards InDelivers OutRequests OutDiscards OutNoRoutes\n"
    "Ip: 1 64 1000 2 0 0 0 3 990 900 4 0\n"
    "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets "
    "CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
    "Tcp: 1 200 120000 -1 10 5 0 0 2 500 600 RETRANS 0 1 0\n"
    "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors "
    "IgnoredMulti MemErrors\n"
    "Udp: 20 1 5 20 0 0 0 0 0\n";

std::string snmp(uint64_t retrans) {
  std::string s = kSnmp;
  s.replace(s.find("RETRANS"), 7, std::to_string(retrans));
  return s;
}

class KernelFake : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("weft-hcs-k-" + random_hex(5));
  }
  void TearDown() override { (void)remove_tree(root_); }
  void put(const std::string& rel, const std::string& v) {
    ASSERT_TRUE(mkdir_p(dirname_of(root_ + "/" + rel)).ok());
    ASSERT_TRUE(write_file(root_ + "/" + rel, v).ok());
  }
  HostPaths host() { return HostPaths(root_); }
  KernelProbeConfig procfs() {
    KernelProbeConfig c;
    c.bpf = false;
    return c;
  }
  std::string root_;
};

TEST(Counters, SnmpAndVmstat) {
  EXPECT_EQ(snmp_counter(snmp(7), "Tcp", "RetransSegs"), 7u);
  EXPECT_EQ(snmp_counter(snmp(7), "Ip", "InDiscards"), 3u);
  EXPECT_EQ(snmp_counter(snmp(7), "Udp", "InErrors"), 5u);
  EXPECT_EQ(snmp_counter(snmp(7), "Tcp", "NoSuchCounter"), std::nullopt);
  EXPECT_EQ(snmp_counter(snmp(7), "Icmp", "InMsgs"), std::nullopt);
  EXPECT_EQ(snmp_counter("Tcp: RetransSegs\n", "Tcp", "RetransSegs"), std::nullopt);  // no values
  EXPECT_EQ(vmstat_counter("nr_free_pages 100\noom_kill 42\npgfault 9\n", "oom_kill"), 42u);
  EXPECT_EQ(vmstat_counter("nr_free_pages 100\n", "oom_kill"), std::nullopt);
}

TEST_F(KernelFake, TcpRetransmitRateFromSnmp) {
  put("proc/net/snmp", snmp(100));
  KernelProbeConfig cfg = procfs();
  cfg.tcp_retrans_degraded_per_s = 50;
  RateProbe p(RateProbe::Kind::kTcpRetransmits, host(), cfg);
  EXPECT_EQ(p.attach(), "procfs");
  uint64_t t0 = now_realtime_us();
  put("proc/net/snmp", snmp(110));
  Sample s = p.run(t0 + 1'000'000);
  EXPECT_EQ(s.health, Health::kOk);
  EXPECT_EQ(s.metrics["source"], "procfs");
  put("proc/net/snmp", snmp(310));  // 200 in 2 s = 100/s
  s = p.run(t0 + 3'000'000);
  EXPECT_EQ(s.health, Health::kDegraded) << s.detail;
  EXPECT_NEAR(s.metrics["per_s"].get<double>(), 100.0, 0.5);
  put("proc/net/snmp", snmp(5));  // counters reset (netns gone): not negative, not a spike
  s = p.run(t0 + 4'000'000);
  EXPECT_EQ(s.health, Health::kOk);
  EXPECT_EQ(s.metrics["per_s"], 0.0);
  put("proc/net/snmp", "garbage");
  EXPECT_EQ(p.run(t0 + 5'000'000).health, Health::kUnknown);
}

TEST_F(KernelFake, DropsFromSnmpAndNetstat) {
  put("proc/net/snmp", snmp(0));
  put("proc/net/netstat",
      "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPBacklogDrop\nTcpExt: 0 1 2 3\n");
  RateProbe p(RateProbe::Kind::kNetDrops, host(), procfs());
  EXPECT_EQ(p.attach(), "procfs");
  uint64_t t0 = now_realtime_us();
  put("proc/net/netstat",
      "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPBacklogDrop\nTcpExt: 0 1 12 3\n");
  Sample s = p.run(t0 + 1'000'000);
  EXPECT_EQ(s.health, Health::kOk);
  EXPECT_EQ(s.metrics["top_since_last_sample"]["TcpExt.ListenDrops"], 10);
}

TEST_F(KernelFake, OomFallbackClassifiesFromTheKernelLog) {
  put("proc/vmstat", "oom_kill 3\n");
  KernelProbeConfig cfg = procfs();
  cfg.memcg_oom_storm_per_min = 100;
  cfg.oom_global_failed = 3;
  OomProbe p(host(), cfg);
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  EXPECT_EQ(p.attach(**loop, nullptr), "procfs");
  uint64_t t = now_realtime_us();
  // Two container OOMs, told apart by the kernel log: the machine is fine.
  p.observe_kmsg(KernelEvent::kOomKillMemcg, t);
  p.observe_kmsg(KernelEvent::kOomKillMemcg, t);
  put("proc/vmstat", "oom_kill 5\n");
  Sample s = p.run(t);
  EXPECT_EQ(s.health, Health::kOk) << s.detail;
  EXPECT_EQ(s.metrics["memcg_kills_window"], 2);
  EXPECT_EQ(s.metrics["source"], "procfs");
  // A kill the kernel log did not classify counts as machine-wide: unknown is not harmless.
  put("proc/vmstat", "oom_kill 6\n");
  s = p.run(t + 1);
  EXPECT_EQ(s.health, Health::kDegraded);
  EXPECT_EQ(s.metrics["unclassified"], 1);
  // Machine-wide kills from the log, up to the FAILED threshold.
  p.observe_kmsg(KernelEvent::kOomKillGlobal, t + 2);
  p.observe_kmsg(KernelEvent::kOomKillGlobal, t + 2);
  put("proc/vmstat", "oom_kill 8\n");
  s = p.run(t + 3);
  EXPECT_EQ(s.health, Health::kFailed);
  EXPECT_EQ(s.metrics["global_kills_window"], 3);
  // Once the window has passed the machine-wide kills no longer count.
  s = p.run(t + cfg.oom_window_us + 10);
  EXPECT_EQ(s.health, Health::kOk) << s.detail;
}

TEST_F(KernelFake, OomStormFromRecordedKills) {
  KernelProbeConfig cfg = procfs();
  cfg.memcg_oom_storm_per_min = 100;
  put("proc/vmstat", "oom_kill 0\n");
  OomProbe p(host(), cfg);
  uint64_t t = now_realtime_us();
  // 99 kills half a minute ago: below the per-minute threshold, none in the last 10 s.
  for (int i = 0; i < 99; ++i)
    p.record(OomKill{t - 30'000'000, static_cast<uint32_t>(i), true, "x", "c"});
  put("proc/vmstat", "oom_kill 99\n");
  // No source until attach(): a probe with no source is UNKNOWN, never OK.
  EXPECT_EQ(p.run(t).health, Health::kUnknown);
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  p.attach(**loop, nullptr);
  EXPECT_EQ(p.run(t).health, Health::kOk);
  // The 100th kill in the minute (procfs mode: counted by vmstat, told apart by its log
  // line): a storm.
  put("proc/vmstat", "oom_kill 100\n");
  p.observe_kmsg(KernelEvent::kOomKillMemcg, t - 30'000'000);
  Sample s = p.run(t);
  EXPECT_EQ(s.health, Health::kDegraded) << s.detail;
  EXPECT_NE(s.detail.find("OOM storm"), std::string::npos);
  // Half a minute later those have aged out of the minute: calm again.
  EXPECT_EQ(p.run(t + 31'000'000).health, Health::kOk);
  // 17 kills within 10 s is a rate of 102 a minute: a storm seen in seconds.
  uint64_t t2 = t + 32'000'000;
  put("proc/vmstat", "oom_kill 117\n");
  for (int i = 0; i < 17; ++i) p.observe_kmsg(KernelEvent::kOomKillMemcg, t2);
  s = p.run(t2);
  EXPECT_EQ(s.health, Health::kDegraded) << s.detail;
  EXPECT_EQ(s.metrics["memcg_kills_last_10s"], 17);
  EXPECT_FALSE(s.metrics.contains("unclassified"));
}

TEST_F(KernelFake, PsiTriggerIsCheckedAgainstTheStallTotal) {
  put("proc/pressure/memory",
      "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0 avg60=0 avg300=0 "
      "total=0\n");
  PsiProbe p(host(), "memory", 20, 50);
  // A fake tree takes the trigger write as plain data (rewritten below): what matters
  // here is the check of a fired trigger.
  (void)p.arm_trigger();
  put("proc/pressure/memory",
      "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0 avg60=0 avg300=0 "
      "total=0\n");
  EXPECT_EQ(p.run(now_realtime_us()).health, Health::kOk);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // The total has not grown: a trigger now is spurious and changes nothing.
  EXPECT_FALSE(p.triggered(now_realtime_us()));
  EXPECT_EQ(p.run(now_realtime_us()).health, Health::kOk);
  // 400 ms of stall (20% of the 2 s window) since arming: real.
  put("proc/pressure/memory",
      "some avg10=0.00 avg60=0.00 avg300=0.00 total=401000\nfull avg10=0 avg60=0 avg300=0 "
      "total=0\n");
  EXPECT_TRUE(p.triggered(now_realtime_us()));
  Sample s = p.run(now_realtime_us());
  EXPECT_EQ(s.health, Health::kDegraded);
  EXPECT_EQ(s.metrics["triggers"], 1);
  EXPECT_EQ(s.metrics["spurious_triggers"], 1);
}

TEST(SocketProbe, MissingSilentAndAnswering) {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-hcs-s-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  struct Cleanup {  // even when an assertion ends the test early
    std::string dir;
    int fd = -1;
    ~Cleanup() {
      if (fd >= 0) ::close(fd);
      (void)remove_tree(dir);
    }
  } cleanup{dir};
  std::string path = dir + "/d.sock";
  auto p = make_socket_probe("weft-agent", path, "agent.info", 300);
  Sample s = p->run(0);
  EXPECT_EQ(s.health, Health::kFailed);
  EXPECT_NE(s.detail.find("not answering"), std::string::npos);

  int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cleanup.fd = l;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(l, 4), 0);
  // Accepts but never answers: a hung daemon is FAILED after the timeout.
  s = p->run(0);
  EXPECT_EQ(s.health, Health::kFailed) << s.detail;
  int hung = ::accept(l, nullptr, nullptr);  // the connection the probe gave up on
  ::close(hung);
  // Answers at once.
  std::thread server([l] {
    int c = ::accept(l, nullptr, nullptr);
    char buf[4096];
    ssize_t n = ::read(c, buf, sizeof buf);
    (void)n;
    std::string reply = "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n";
    (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::close(c);
  });
  s = p->run(0);
  server.join();
  EXPECT_EQ(s.health, Health::kOk) << s.detail;
  EXPECT_TRUE(s.metrics.contains("latency_ms"));
}

TEST(HcsConfig, DefaultsAndEveryTable) {
  auto c = parse_hcs_config("", "hcs.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->agent_socket, "/run/weft/agent.sock");
  EXPECT_TRUE(c->kernel.bpf);
  c = parse_hcs_config(R"(interval = "2s"
confirm_interval = "500ms"
psi_triggers = false
[kernel]
bpf = false
oom_window = "5m"
oom_global_failed = 2
memcg_oom_storm_per_min = 300
tcp_retrans_degraded_per_s = 50.5
drops_degraded_per_s = 1000
[liveness]
agent_socket = ""
sidekick_socket = "/run/x.sock"
timeout = "500ms"
)",
                       "hcs.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->confirm_interval_us, 500'000u);
  EXPECT_FALSE(c->psi_triggers);
  EXPECT_FALSE(c->kernel.bpf);
  EXPECT_EQ(c->kernel.oom_window_us, 300'000'000u);
  EXPECT_EQ(c->kernel.oom_global_failed, 2);
  EXPECT_EQ(c->kernel.memcg_oom_storm_per_min, 300);
  EXPECT_DOUBLE_EQ(c->kernel.tcp_retrans_degraded_per_s, 50.5);
  EXPECT_EQ(c->agent_socket, "");
  EXPECT_EQ(c->sidekick_socket, "/run/x.sock");
  EXPECT_EQ(c->liveness_timeout_ms, 500);
}

TEST(HcsConfig, ErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"[kernel]\noom_global_failed = 0\n", "hcs.toml:2"},
      {"[kernel]\ntcp_retrans_degraded_per_s = \"x\"\n", "hcs.toml:2"},
      {"[kernel]\nbogus = 1\n", "bogus"},
      {"[liveness]\nagent_socket = \"relative\"\n", "hcs.toml:2"},
      {"confirm_interval = \"1ms\"\n", "hcs.toml:1"},
      {"[[disk]]\nmin_free_pct = 5\n", "path"},
      {"psi_degraded_pct = 120\n", "hcs.toml:1"},
      {"\npsi = [\"cpu\", \"net\"]\n", "hcs.toml:2"},
      {"[hysteresis]\nfail_after = 0\n", "hcs.toml:2"},
  };
  auto only = parse_hcs_config("psi = [\"memory\", \"io\", \"io\"]\n", "hcs.toml");
  ASSERT_TRUE(only.ok()) << only.error().str();
  EXPECT_EQ(only->psi, (std::vector<std::string>{"memory", "io"}));
  for (const auto& c : cases) {
    auto r = parse_hcs_config(c.text, "hcs.toml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.error().str().find(c.expect), std::string::npos) << r.error().str();
  }
}

}  // namespace
}  // namespace weft::hcs
