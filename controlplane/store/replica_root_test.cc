// A leader partitioned from etcd while its machines still reach it (root: network
// namespaces). etcd and replica B live in one namespace, replica A in another joined by
// a veth; the machines talk to both over Unix sockets, which no network partition
// touches. The veth goes down: A can neither keep its lease nor write, so it stops
// acting and exits; B leads; the machines move to B; the link comes back, A (restarted,
// as systemd would) follows B, and no task ever ran twice.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"
#include "controlplane/store/etcd_client.h"
#include "testing/etcd_server.h"
#include "testing/replica_harness.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;
using weft::testing::Machine;
using weft::testing::Replica;

bool sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
}

class ReplicasRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      if (std::getenv("WEFT_REQUIRE_ROOT_TESTS")) FAIL() << "needs root (network namespaces)";
      GTEST_SKIP() << "needs root (network namespaces)";
    }
    std::string tag = random_hex(3);
    etcd_ns_ = "wre-" + tag;
    cp_ns_ = "wrc-" + tag;
    ASSERT_TRUE(sh("ip netns add " + etcd_ns_) && sh("ip netns add " + cp_ns_));
    ASSERT_TRUE(
        sh("ip -n " + etcd_ns_ + " link set lo up") && sh("ip -n " + cp_ns_ + " link set lo up") &&
        sh("ip -n " + etcd_ns_ + " link add eth0 type veth peer name eth0 netns " + cp_ns_) &&
        sh("ip -n " + etcd_ns_ + " addr add 10.77.0.1/24 dev eth0") &&
        sh("ip -n " + cp_ns_ + " addr add 10.77.0.2/24 dev eth0") &&
        sh("ip -n " + etcd_ns_ + " link set eth0 up") &&
        sh("ip -n " + cp_ns_ + " link set eth0 up"));
    // This thread (and what it forks: etcd, replica B) joins the etcd side.
    home_ns_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int ns = open(("/run/netns/" + etcd_ns_).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ns, 0);
    ASSERT_EQ(setns(ns, CLONE_NEWNET), 0);
    close(ns);
    dir_ = std::filesystem::temp_directory_path() / ("weft-replicas-root-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>(1, "", "10.77.0.1");
    ASSERT_EQ(etcd_->error(), "");
    a_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "a", etcd_->client_config());
    a_->set_netns(cp_ns_);
    b_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "b", etcd_->client_config());
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    etcd_.reset();
    if (home_ns_ >= 0) {
      (void)setns(home_ns_, CLONE_NEWNET);
      close(home_ns_);
    }
    if (!etcd_ns_.empty()) (void)sh("ip netns del " + etcd_ns_);
    if (!cp_ns_.empty()) (void)sh("ip netns del " + cp_ns_);
    if (!dir_.empty()) (void)remove_tree(dir_);
  }
  std::string etcd_ns_, cp_ns_, dir_;
  int home_ns_ = -1;
  std::unique_ptr<weft::testing::EtcdServer> etcd_;
  std::unique_ptr<Replica> a_, b_;
};

TEST_F(ReplicasRoot, ALeaderCutOffFromEtcdStopsActingAndNothingRunsTwice) {
  a_->start();
  for (int i = 0; i < 500 && !a_->leading(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(a_->leading()) << a_->log();
  struct stat in_a {
  }, ns_a{};
  ASSERT_EQ(stat(("/proc/" + std::to_string(a_->pid()) + "/ns/net").c_str(), &in_a), 0);
  ASSERT_EQ(stat(("/run/netns/" + cp_ns_).c_str(), &ns_a), 0);
  ASSERT_EQ(in_a.st_ino, ns_a.st_ino) << "replica A is not in its network namespace";
  b_->start();
  std::vector<std::string> socks = {a_->sock(), b_->sock()};
  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 3; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ASSERT_TRUE(ms.back()->connect(socks));
  }
  ASSERT_TRUE(a_->call("entitlement.create", {{"name", "web"}, {"quota", 3}}).ok());
  ASSERT_TRUE(a_->call("job.create", {{"name", "site"},
                                      {"entitlement", "web"},
                                      {"count", 3},
                                      {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
                                      {"task", {{"argv", {"/bin/sleep", "infinity"}}}}})
                  .ok());
  std::map<std::string, int> seen;  // task id -> machines that ran it at once (max)
  auto round = [&] {
    std::map<std::string, int> copies;
    for (auto& m : ms) {
      if (!m->connected()) m->connect(socks);
      m->report();
      for (const auto& t : m->running()) ++copies[t];
    }
    std::map<std::string, int> per_index;
    for (const auto& [id, n] : copies) {
      EXPECT_EQ(n, 1) << id << " runs on two machines";
      ++per_index[id.substr(0, id.rfind('.'))];
    }
    for (const auto& [index, n] : per_index) EXPECT_EQ(n, 1) << "two copies of " << index;
    int running = 0;
    for (auto& m : ms) running += static_cast<int>(m->running().size());
    return running;
  };
  for (int i = 0; i < 200 && round() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(round(), 3);
  int starts_before = 0;
  for (auto& m : ms) starts_before += m->starts();

  // The partition: A still serves its Unix socket, but cannot reach etcd.
  ASSERT_TRUE(sh("ip -n " + cp_ns_ + " link set eth0 down"));
  auto cut = Clock::now();
  int code = -1;
  while (Clock::now() - cut < std::chrono::seconds(10) && (code = a_->exited()) < 0) {
    round();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(code, 1) << a_->log();
  EXPECT_NE(a_->log().find("no longer leads"), std::string::npos) << a_->log();
  for (int i = 0; i < 500 && !b_->leading(); ++i) {
    round();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(b_->leading()) << "B:\n" << b_->log() << "\nA:\n" << a_->log();
  for (int i = 0; i < 50; ++i) round();
  // Healed: A comes back (systemd) as a follower of B; nothing restarted, nothing twice.
  ASSERT_TRUE(sh("ip -n " + cp_ns_ + " link set eth0 up"));
  a_->start();
  bool follows = false;
  for (int i = 0; i < 300 && !follows; ++i) {
    auto st = a_->call("controlplane.status");
    follows = st.ok() && !st->value("leading", true) && st->value("leader", "") == b_->address();
    round();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(follows) << a_->log();
  EXPECT_EQ(round(), 3);
  int starts_after = 0;
  for (auto& m : ms) starts_after += m->starts();
  EXPECT_EQ(starts_after, starts_before) << "a task was started again";
  auto show = b_->call("job.show", {{"name", "site"}});
  ASSERT_TRUE(show.ok());
  EXPECT_EQ((*show)["tasks"].size(), 3u) << show->dump();
}

// An etcd member cut off from the other two while the control planes still reach it
// (root: each member in a network namespace of its own on a bridge, the replicas and the
// test in the bridge's). Each member in turn, the raft leader among them, both ways, for
// longer than etcd's election timeout; meanwhile an operator's change is made and
// acknowledged, the machines run their tasks on and nothing runs twice. Healed, the
// cluster is whole, and after the leading replica is SIGKILLed the other shows every
// change that was acknowledged.
class EtcdMembersRoot : public ::testing::Test {
 protected:
  static constexpr int kMembers = 3;
  void SetUp() override {
    if (geteuid() != 0) {
      if (std::getenv("WEFT_REQUIRE_ROOT_TESTS")) FAIL() << "needs root (network namespaces)";
      GTEST_SKIP() << "needs root (network namespaces)";
    }
    tag_ = random_hex(3);
    hub_ = "wrh-" + tag_;
    made_.push_back(hub_);
    ASSERT_TRUE(sh("ip netns add " + hub_) && sh("ip -n " + hub_ + " link set lo up") &&
                sh("ip -n " + hub_ + " link add br0 type bridge") &&
                sh("ip -n " + hub_ + " addr add 10.78.0.1/24 dev br0") &&
                sh("ip -n " + hub_ + " link set br0 up"));
    std::vector<std::string> hosts, netns;
    for (int k = 0; k < kMembers; ++k) {
      std::string ns = "wrm" + std::to_string(k) + "-" + tag_;
      std::string peer = "wp" + std::to_string(k) + tag_;
      std::string ip = "10.78.0." + std::to_string(11 + k);
      made_.push_back(ns);
      ASSERT_TRUE(
          sh("ip netns add " + ns) && sh("ip -n " + ns + " link set lo up") &&
          sh("ip -n " + ns + " link add eth0 type veth peer name " + peer + " netns " + hub_) &&
          sh("ip -n " + ns + " addr add " + ip + "/24 dev eth0") &&
          sh("ip -n " + ns + " link set eth0 up") &&
          sh("ip -n " + hub_ + " link set " + peer + " master br0") &&
          sh("ip -n " + hub_ + " link set " + peer + " up"));
      hosts.push_back(ip);
      netns.push_back(ns);
    }
    // This thread (and what it forks: the replicas) joins the bridge's side.
    home_ns_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int ns = open(("/run/netns/" + hub_).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ns, 0);
    ASSERT_EQ(setns(ns, CLONE_NEWNET), 0);
    close(ns);
    members_ = netns;
    ips_ = hosts;
    dir_ = std::filesystem::temp_directory_path() / ("weft-etcd-members-root-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>(kMembers, "", "", hosts, netns);
    ASSERT_EQ(etcd_->error(), "");
    a_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "a", etcd_->client_config());
    b_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "b", etcd_->client_config());
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    etcd_.reset();
    if (home_ns_ >= 0) {
      (void)setns(home_ns_, CLONE_NEWNET);
      close(home_ns_);
    }
    for (const auto& ns : made_) (void)sh("ip netns del " + ns);
    if (!dir_.empty()) (void)remove_tree(dir_);
  }
  // Member k drops everything from and to the other members (its clients still reach it).
  bool cut(int k) {
    std::string others;
    for (int i = 0; i < kMembers; ++i)
      if (i != k) others += (others.empty() ? "" : ", ") + ips_[static_cast<size_t>(i)];
    std::string file = dir_ + "/cut.nft";
    if (!write_file(file,
                    "table inet weft_cut {\n"
                    "  chain in { type filter hook input priority 0; ip saddr { " +
                        others +
                        " } drop; }\n"
                        "  chain out { type filter hook output priority 0; ip daddr { " +
                        others + " } drop; }\n}\n")
             .ok())
      return false;
    return sh("ip netns exec " + members_[static_cast<size_t>(k)] + " nft -f " + file);
  }
  bool heal(int k) {
    return sh("ip netns exec " + members_[static_cast<size_t>(k)] +
              " nft delete table inet weft_cut");
  }
  // Member k answers a linearizable read through itself alone (it needs to be in a
  // quorum for that: a member cut off cannot).
  bool answers(int k) {
    etcd::Config c = etcd_->client_config();
    c.endpoints = {etcd_->endpoint(static_cast<size_t>(k))};
    auto client = etcd::Client::create(c);
    return client.ok() && (*client)->get("/probe").ok();
  }
  bool whole() {
    for (int k = 0; k < kMembers; ++k)
      if (!answers(k)) return false;
    return true;
  }
  Replica* leader() {
    for (Replica* r : {a_.get(), b_.get()})
      if (r->exited() < 0 && r->leading()) return r;
    return nullptr;
  }
  std::string tag_, hub_, dir_;
  std::vector<std::string> made_, members_, ips_;
  int home_ns_ = -1;
  std::unique_ptr<weft::testing::EtcdServer> etcd_;
  std::unique_ptr<Replica> a_, b_;
};

TEST_F(EtcdMembersRoot, AMemberCutOffFromTheOthersLosesNoAcknowledgedChangeAndRunsNothingTwice) {
  a_->start();
  b_->start();
  std::vector<std::string> socks = {a_->sock(), b_->sock()};
  auto wait = [&](double seconds, const std::function<bool()>& ok) {
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ok();
  };
  ASSERT_TRUE(wait(15, [&] { return leader() != nullptr; })) << a_->log() << b_->log();
  // The machines report on threads of their own, every 100 ms, whatever the test waits
  // on: a machine silent past the dead-machine timeout has its tasks started elsewhere
  // (a job that does not ask for at most one copy), which is not what this test is about.
  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 3; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ms.back()->start_reporting(socks, 100);
  }
  ASSERT_TRUE(leader()->call("entitlement.create", {{"name", "web"}, {"quota", 3}}).ok());
  ASSERT_TRUE(leader()
                  ->call("job.create", {{"name", "site"},
                                        {"entitlement", "web"},
                                        {"count", 3},
                                        {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
                                        {"task", {{"argv", {"/bin/sleep", "infinity"}}}}})
                  .ok());
  // One look: a replica that exited is started again (systemd), and no task index runs
  // twice; how many run.
  bool restart = true;  // what systemd does, until the end
  auto round = [&] {
    for (Replica* r : {a_.get(), b_.get()})
      if (restart && r->exited() >= 0) r->start();
    std::map<std::string, int> per_index;
    int running = 0;
    auto world = Machine::snapshot();
    for (auto& m : ms) {
      for (const auto& t : m->running()) {
        ++per_index[t.substr(0, t.rfind('.'))];
        ++running;
      }
    }
    for (const auto& [index, n] : per_index) EXPECT_EQ(n, 1) << "two copies of " << index;
    return running;
  };
  int count = 3;
  ASSERT_TRUE(wait(20, [&] { return round() == count; }));
  for (int k = 0; k < kMembers; ++k) {
    ASSERT_TRUE(cut(k)) << "member " << k;
    auto cut_at = Clock::now();
    EXPECT_FALSE(answers(k)) << "member " << k << " is not cut off";
    // An operator's change while the member is cut off, acknowledged by whichever
    // replica leads (the write may wait for a replica to fail over to another member).
    count = count == 3 ? 2 : 3;
    bool acked = wait(30, [&] {
      round();
      Replica* l = leader();
      return l && l->call("job.scale", {{"name", "site"}, {"count", count}}).ok();
    });
    ASSERT_TRUE(acked) << "member " << k << " cut off: no change acknowledged\n"
                       << a_->log() << b_->log();
    double took = std::chrono::duration<double>(Clock::now() - cut_at).count();
    std::printf("member %d cut off: a change acknowledged after %.2f s\n", k, took);
    // Longer than etcd's election timeout (1 s): a leader member cut off loses its place.
    wait(3, [&] {
      round();
      return false;
    });
    ASSERT_TRUE(heal(k));
    ASSERT_TRUE(wait(30, [&] { return whole() && leader() != nullptr && round() == count; }))
        << "member " << k << " healed: not whole\n"
        << a_->log() << b_->log();
  }
  // The leading replica dies: the other shows every acknowledged change.
  Replica* l = leader();
  ASSERT_NE(l, nullptr);
  Replica* other = l == a_.get() ? b_.get() : a_.get();
  restart = false;  // the other must take over (else the killed one, restarted, might)
  l->stop(SIGKILL);
  ASSERT_TRUE(wait(20, [&] {
    round();
    return other->leading();
  })) << other->log();
  auto show = other->call("job.show", {{"name", "site"}});
  ASSERT_TRUE(show.ok()) << show.error().str();
  EXPECT_EQ((*show)["spec"]["count"], count) << show->dump();
  EXPECT_TRUE(wait(20, [&] { return round() == count; }));
}

}  // namespace
}  // namespace weft
