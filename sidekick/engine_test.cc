// The switch engine against a fake /proc and /sys tree: every knob family, diff switches,
// rollback on a failed required knob, best effort, baselines and `off`, crash recovery.
#include "sidekick/engine.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::sidekick {
namespace {

class FakeHost : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("weft-sk-" + random_hex(5));
    put("proc/sys/net/core/somaxconn", "128\n");
    put("proc/sys/vm/swappiness", "60\n");
    put("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n");
    put("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
    put("sys/kernel/mm/transparent_hugepage/defrag",
        "always defer [defer+madvise] madvise never\n");
    put("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
    put("sys/devices/system/cpu/intel_pstate/no_turbo", "1\n");
    put("sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "powersave\n");
    put("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave\n");
    put("sys/class/net/eth0/mtu", "1500\n");
    put("sys/class/net/eth1/mtu", "1500\n");
    put("sys/class/net/lo/mtu", "65536\n");
    put("proc/interrupts",
        "           CPU0       CPU1\n"
        "  24:         10          0   PCI-MSI 49152-edge      eth0-TxRx-0\n"
        "  25:         10          0   PCI-MSI 49153-edge      eth0-TxRx-1\n"
        "  26:          3          0   PCI-MSI 49154-edge      nvme0q1\n"
        " NMI:          0          0   Non-maskable interrupts\n");
    put("proc/irq/24/smp_affinity_list", "0-1\n");
    put("proc/irq/25/smp_affinity_list", "0-1\n");
    put("proc/irq/26/smp_affinity_list", "0-1\n");
    put("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda ro quiet\n");
    put("cg/cgroup.subtree_control", "cpu memory pids\n");
    engine_ = open_engine();
  }
  void TearDown() override {
    engine_.reset();
    (void)remove_tree(root_);
  }
  std::unique_ptr<Engine> open_engine() {
    auto e = Engine::open(root_ + "/journal.db", std::make_unique<FakeCgroupHostKnobs>(root_));
    EXPECT_TRUE(e.ok()) << e.error().str();
    return std::move(e).value();
  }
  void put(const std::string& rel, const std::string& v) {
    ASSERT_TRUE(mkdir_p(dirname_of(root_ + "/" + rel)).ok());
    ASSERT_TRUE(write_file(root_ + "/" + rel, v).ok());
  }
  std::string get(const std::string& rel) {
    return trim(read_file(root_ + "/" + rel).value_or("<missing>"));
  }
  // A fake file holds what was last written; the kernel's THP files show the choice in
  // brackets. Either way, the selected value.
  std::string thp(const std::string& which) {
    std::string v = get("sys/kernel/mm/transparent_hugepage/" + which);
    auto a = v.find('['), b = v.find(']');
    return a == std::string::npos ? v : v.substr(a + 1, b - a - 1);
  }
  std::set<std::string> controllers() {
    std::set<std::string> out;
    for (const auto& c : split(get("cg/cgroup.subtree_control"), ' '))
      if (!c.empty()) out.insert(c);
    return out;
  }
  const std::set<std::string> kAllControllers = {"cpu", "memory", "pids"};
  Profile profile(const std::string& name, const std::string& text) {
    auto p = parse_profile_text(text, name + ".toml");
    EXPECT_TRUE(p.ok()) << p.error().str();
    p->name = name;
    return *p;
  }

  // cgroup.subtree_control in a fake tree is a plain file: emulate "+x"/"-x" edits.
  class FakeCgroupHostKnobs : public HostKnobs {
   public:
    explicit FakeCgroupHostKnobs(const std::string& root)
        : HostKnobs(HostPaths(root), root + "/cg"), root_(root) {}
    Status write(const std::string& family, const std::string& key,
                 const std::string& value) override {
      if (family != "cgroup") return HostKnobs::write(family, key, value);
      std::string f = root_ + "/cg/cgroup.subtree_control";
      auto cur = split(trim(read_file(f).value_or("")), ' ');
      cur.erase(std::remove(cur.begin(), cur.end(), key), cur.end());
      if (value == "on") cur.push_back(key);
      std::string out;
      for (const auto& c : cur)
        if (!c.empty()) out += (out.empty() ? "" : " ") + c;
      return write_file(f, out + "\n");
    }

   private:
    std::string root_;
  };

  std::string root_;
  std::unique_ptr<Engine> engine_;
};

const char* kWeb = R"(
[sysctl]
"net.core.somaxconn" = 4096
"net.ipv4.tcp_rmem" = "4096 131072 6291456"
[thp]
enabled = "always"
defrag = "defer"
[hugepages]
"2M" = 8
[cpu]
turbo = true
governor = "performance"
[nic."eth*"]
mtu = 9000
[irq."eth0-TxRx-*"]
cpus = "1"
[cgroup]
disable = ["cpu"]
)";

TEST_F(FakeHost, SwitchAppliesEveryFamilyAndVerifies) {
  auto rep = engine_->apply(profile("web", kWeb));
  ASSERT_EQ(rep.outcome, Outcome::kOk) << rep.to_json().dump(2);
  EXPECT_EQ(get("proc/sys/net/core/somaxconn"), "4096");
  EXPECT_EQ(thp("enabled"), "always");
  EXPECT_EQ(thp("defrag"), "defer");
  EXPECT_EQ(get("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"), "8");
  EXPECT_EQ(get("sys/devices/system/cpu/intel_pstate/no_turbo"), "0");
  EXPECT_EQ(get("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor"), "performance");
  EXPECT_EQ(get("sys/class/net/eth0/mtu"), "9000");
  EXPECT_EQ(get("sys/class/net/eth1/mtu"), "9000");
  EXPECT_EQ(get("sys/class/net/lo/mtu"), "65536");  // not matched by eth*
  EXPECT_EQ(get("proc/irq/24/smp_affinity_list"), "1");
  EXPECT_EQ(get("proc/irq/25/smp_affinity_list"), "1");
  EXPECT_EQ(get("proc/irq/26/smp_affinity_list"), "0-1");  // nvme queue untouched
  EXPECT_EQ(controllers(), (std::set<std::string>{"memory", "pids"}));
  EXPECT_EQ(*engine_->active_profile(), "web");
  EXPECT_EQ(engine_->verify().outcome, Outcome::kOk);
  // tcp_rmem already matched (whitespace differs): reported ok, not written.
  bool rmem_ok = false;
  for (const auto& k : rep.knobs) rmem_ok |= k.id == "sysctl:net.ipv4.tcp_rmem" && k.status == "ok";
  EXPECT_TRUE(rmem_ok);
}

TEST_F(FakeHost, DiffSwitchTouchesOnlyChangesAndRestoresLeavers) {
  ASSERT_EQ(engine_->apply(profile("web", kWeb)).outcome, Outcome::kOk);
  const char* web2 = R"(
[sysctl]
"net.core.somaxconn" = 4096
"vm.swappiness" = 10
[thp]
enabled = "always"
defrag = "defer"
)";
  auto p = engine_->plan(profile("web2", web2));
  ASSERT_TRUE(p.ok()) << p.error().str();
  std::set<std::string> changed;
  for (const auto& c : p->changes) changed.insert(c.knob.id + (c.restore ? " (restore)" : ""));
  // somaxconn and THP are already right; swappiness is new; the rest go back to baseline.
  EXPECT_FALSE(changed.count("sysctl:net.core.somaxconn"));
  EXPECT_TRUE(changed.count("sysctl:vm.swappiness"));
  EXPECT_TRUE(changed.count("nic:eth0/mtu (restore)"));
  EXPECT_TRUE(changed.count("cpu:turbo (restore)"));
  EXPECT_TRUE(changed.count("cgroup:cpu (restore)"));
  auto rep = engine_->apply(profile("web2", web2));
  ASSERT_EQ(rep.outcome, Outcome::kOk) << rep.to_json().dump(2);
  EXPECT_EQ(get("sys/class/net/eth0/mtu"), "1500");
  EXPECT_EQ(get("sys/devices/system/cpu/intel_pstate/no_turbo"), "1");
  EXPECT_EQ(get("proc/irq/24/smp_affinity_list"), "0-1");
  EXPECT_EQ(controllers(), kAllControllers);
  EXPECT_EQ(get("proc/sys/vm/swappiness"), "10");
}

TEST_F(FakeHost, RequiredFailureRollsBackEverything) {
  engine_->fail_write_of("nic:eth1/mtu");  // midway: after sysctl, THP, cpu, eth0
  auto rep = engine_->apply(profile("web", kWeb));
  ASSERT_EQ(rep.outcome, Outcome::kFailed);
  EXPECT_NE(rep.error.find("nic:eth1/mtu"), std::string::npos) << rep.error;
  EXPECT_NE(rep.error.find("web.toml:"), std::string::npos) << rep.error;
  EXPECT_EQ(get("proc/sys/net/core/somaxconn"), "128");
  EXPECT_EQ(thp("enabled"), "madvise");
  EXPECT_EQ(get("sys/class/net/eth0/mtu"), "1500");
  EXPECT_EQ(get("sys/devices/system/cpu/intel_pstate/no_turbo"), "1");
  EXPECT_EQ(controllers(), kAllControllers);
  EXPECT_FALSE(engine_->active_profile());
  auto h = engine_->history(5);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)[0]["state"], "rolled-back");
}

TEST_F(FakeHost, BestEffortFailureDegrades) {
  auto rep = engine_->apply(profile("p", R"(
[sysctl]
"net.core.somaxconn" = 1024
"net.no.such.key" = { value = 1, best_effort = true }
)"));
  EXPECT_EQ(rep.outcome, Outcome::kDegraded) << rep.to_json().dump(2);
  EXPECT_EQ(get("proc/sys/net/core/somaxconn"), "1024");
  auto req = engine_->apply(profile("q", "[sysctl]\n\"net.no.such.key\" = 1\n"));
  EXPECT_EQ(req.outcome, Outcome::kFailed);
  // The unreadable knob left no baseline behind, so off restores cleanly.
  auto off = engine_->off();
  EXPECT_EQ(off.outcome, Outcome::kOk) << off.to_json().dump(2);
  EXPECT_EQ(get("proc/sys/net/core/somaxconn"), "128");
}

TEST_F(FakeHost, OffRestoresBaselinesFromBeforeFirstTouch) {
  ASSERT_EQ(engine_->apply(profile("web", kWeb)).outcome, Outcome::kOk);
  ASSERT_EQ(engine_->apply(profile("more", "[sysctl]\n\"net.core.somaxconn\" = 9999\n")).outcome,
            Outcome::kOk);
  // The baseline is still what the machine had before weft, not web's value.
  auto off = engine_->off();
  ASSERT_EQ(off.outcome, Outcome::kOk) << off.to_json().dump(2);
  EXPECT_EQ(get("proc/sys/net/core/somaxconn"), "128");
  EXPECT_EQ(thp("enabled"), "madvise");
  EXPECT_FALSE(engine_->active_profile());
}

TEST_F(FakeHost, RebootKnobsAndDrift) {
  auto rep = engine_->apply(profile("k",
                                    "[kernel]\ncmdline = [\"quiet\", \"intel_iommu=on\"]\n"
                                    "[sysctl]\n\"vm.swappiness\" = 5\n"));
  EXPECT_EQ(rep.outcome, Outcome::kRebootRequired) << rep.to_json().dump(2);
  put("proc/cmdline", "root=/dev/vda quiet intel_iommu=on\n");  // after the reboot
  EXPECT_EQ(engine_->verify().outcome, Outcome::kOk);
  put("proc/sys/vm/swappiness", "60\n");  // someone else changed it
  auto v = engine_->verify();
  EXPECT_EQ(v.outcome, Outcome::kDrift);
}

TEST_F(FakeHost, SigkillMidSwitchIsRolledBackOnRestart) {
  engine_.reset();
  pid_t p = fork();
  if (p == 0) {
    setenv("WEFT_SIDEKICK_CRASH_AFTER_WRITES", "3", 1);
    auto e = open_engine();
    e->apply(profile("web", kWeb));
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(p, &status, 0), p);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_NE(controllers(), kAllControllers);  // it did get that far
  engine_ = open_engine();
  auto rec = engine_->recover();
  ASSERT_TRUE(rec.ok()) << rec.error().str();
  ASSERT_TRUE(rec->has_value());
  EXPECT_EQ(controllers(), kAllControllers);
  EXPECT_EQ(get("proc/sys/net/core/somaxconn"), "128");
  EXPECT_EQ(thp("enabled"), "madvise");
  EXPECT_FALSE(engine_->active_profile());
  EXPECT_EQ((*engine_->history(1))[0]["state"], "rolled-back");
  // And the next switch works normally.
  EXPECT_EQ(engine_->apply(profile("web", kWeb)).outcome, Outcome::kOk);
}

}  // namespace
}  // namespace weft::sidekick

namespace weft::sidekick {
namespace {

// A huge page pool that the "kernel" fills only partly: each write gets at most
// `budget` pages, and each compaction makes 3 more available.
class CappedPool : public HostKnobs {
 public:
  CappedPool(const std::string& root, int budget)
      : HostKnobs(HostPaths(root), root + "/cg"), budget_(budget) {}
  Status write(const std::string& family, const std::string& key,
               const std::string& value) override {
    if (family == "sysctl" && key == "vm.compact_memory") {
      budget_ += 3;
      return {};
    }
    if (family == "hugepages") {
      int want = std::stoi(value);
      return HostKnobs::write(family, key, std::to_string(std::min(want, budget_)));
    }
    return HostKnobs::write(family, key, value);
  }

 private:
  int budget_;
};

class Convergence : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("weft-conv-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(root_ + "/sys/kernel/mm/hugepages/hugepages-2048kB").ok());
    ASSERT_TRUE(
        write_file(root_ + "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n").ok());
  }
  void TearDown() override { (void)remove_tree(root_); }
  std::unique_ptr<Engine> engine(int budget) {
    auto e = Engine::open(root_ + "/j.db", std::make_unique<CappedPool>(root_, budget));
    EXPECT_TRUE(e.ok());
    return std::move(e).value();
  }
  Profile profile(const std::string& text) {
    auto p = parse_profile_text(text, "hp.toml");
    EXPECT_TRUE(p.ok()) << p.error().str();
    p->name = "hp";
    return *p;
  }
  std::string pool() {
    return trim(
        read_file(root_ + "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages").value_or(""));
  }
  std::string root_;
};

TEST_F(Convergence, ConvergesInTheBackgroundWithProgress) {
  auto e = engine(4);
  auto rep = e->apply(profile("[hugepages]\n\"2M\" = 10\n"));
  ASSERT_EQ(rep.outcome, Outcome::kOk) << rep.to_json().dump(2);
  ASSERT_EQ(rep.knobs.size(), 1u);
  EXPECT_EQ(rep.knobs[0].status, "converging");
  EXPECT_EQ(rep.knobs[0].error, "4/10");
  auto c1 = e->converge_step();
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ((*c1)[0]["progress"], "7/10");
  EXPECT_EQ((*c1)[0]["state"], "converging");
  auto c2 = e->converge_step();
  EXPECT_EQ((*c2)[0]["progress"], "10/10");
  EXPECT_EQ((*c2)[0]["state"], "converged");
  EXPECT_EQ(pool(), "10");
  // A restarted daemon sees the same state; off forgets it and restores the pool.
  e.reset();
  auto again = engine(100);
  EXPECT_EQ((*again->convergence())[0]["state"], "converged");
  EXPECT_EQ(again->off().outcome, Outcome::kOk);
  EXPECT_EQ(pool(), "0");
  EXPECT_TRUE(again->convergence()->empty());
}

TEST_F(Convergence, DeadlineFails) {
  auto e = engine(4);
  auto rep = e->apply(profile("[hugepages]\n\"2M\" = { count = 100, deadline = \"1ms\" }\n"));
  ASSERT_EQ(rep.outcome, Outcome::kOk);
  ::usleep(5000);
  auto c = e->converge_step();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0]["state"], "failed");
  EXPECT_EQ((*c)[0]["progress"], "7/100");
}

TEST_F(Convergence, WaitingSwitchConvergesBeforeItReturns) {
  auto e = engine(4);
  auto rep =
      e->apply(profile("[hugepages]\n\"2M\" = { count = 10, wait = true, deadline = \"30s\" }\n"));
  ASSERT_EQ(rep.outcome, Outcome::kOk) << rep.to_json().dump(2);
  EXPECT_EQ(rep.knobs[0].status, "applied");
  EXPECT_EQ(pool(), "10");
  EXPECT_TRUE(e->convergence()->empty());
  // And one that cannot make it fails the switch and rolls it back.
  auto e2 = engine(0);
  (void)e2->off();
  auto bad = e2->apply(
      profile("[hugepages]\n\"2M\" = { count = 1000, wait = true, deadline = \"300ms\" }\n"));
  EXPECT_EQ(bad.outcome, Outcome::kFailed);
  EXPECT_NE(bad.error.find("before its deadline"), std::string::npos) << bad.error;
}

}  // namespace
}  // namespace weft::sidekick
