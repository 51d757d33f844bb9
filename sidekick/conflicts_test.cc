#include "sidekick/conflicts.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::sidekick {
namespace {

TEST(Conflicts, SysctlDropInsIrqbalanceAndTuned) {
  std::string root = std::filesystem::temp_directory_path() / ("weft-cf-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(root + "/etc/sysctl.d").ok());
  ASSERT_TRUE(write_file(root + "/etc/sysctl.d/99-local.conf",
                         "# c\nnet.core.somaxconn = 1024\nvm/swappiness=5\n")
                  .ok());
  ASSERT_TRUE(mkdir_p(root + "/proc/812").ok());
  ASSERT_TRUE(write_file(root + "/proc/812/comm", "irqbalance\n").ok());
  ASSERT_TRUE(mkdir_p(root + "/proc/900").ok());
  ASSERT_TRUE(write_file(root + "/proc/900/comm", "tuned\n").ok());
  auto p = parse_profile_text(
      "[sysctl]\n\"net.core.somaxconn\" = 4096\n\"vm.swappiness\" = 10\n[irq.\"eth*\"]\ncpus = "
      "\"0\"\n",
      "p.toml");
  ASSERT_TRUE(p.ok());
  auto c = detect_conflicts(p->knobs, HostPaths(root));
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].knob, "sysctl:net.core.somaxconn");
  EXPECT_EQ(c[0].owner, root + "/etc/sysctl.d/99-local.conf:2");
  EXPECT_EQ(c[1].knob, "sysctl:vm.swappiness");
  EXPECT_NE(c[2].owner.find("irqbalance (pid 812)"), std::string::npos);
  EXPECT_NE(c[3].owner.find("tuned"), std::string::npos);
  (void)remove_tree(root);
}

TEST(ImportTuned, ConvertsWhatItCanAndListsTheRest) {
  auto r = import_tuned(R"(
[main]
summary=Optimize for throughput
include=throughput-performance

[cpu]
governor=performance|powersave
energy_performance_preference=performance

[vm]
transparent_hugepages=always

[sysctl]
net.core.somaxconn=2048
vm.dirty_ratio=${f:virt_check:30:40}
kernel/sched_min_granularity_ns=10000000

[sysfs]
/sys/devices/system/cpu/intel_pstate/no_turbo=0

[bootloader]
cmdline=isolcpus=2-3 nohz_full=2-3

[disk]
readahead=>4096
)",
                        "throughput");
  auto p = parse_profile_text(r.toml, "throughput.toml");
  ASSERT_TRUE(p.ok()) << p.error().str() << "\n" << r.toml;
  EXPECT_EQ(p->description, "Optimize for throughput");
  std::set<std::string> ids;
  for (const auto& k : p->knobs) ids.insert(k.id + "=" + k.value);
  EXPECT_TRUE(ids.count("sysctl:net.core.somaxconn=2048"));
  EXPECT_TRUE(ids.count("sysctl:kernel.sched_min_granularity_ns=10000000"));
  EXPECT_TRUE(ids.count("thp:enabled=always"));
  EXPECT_TRUE(ids.count("cpu:governor=performance"));
  EXPECT_TRUE(ids.count("cpu:turbo=on"));
  EXPECT_TRUE(ids.count("kernel:isolcpus=2-3=present"));
  ASSERT_EQ(r.unconverted.size(), 3u);
  EXPECT_NE(r.unconverted[0].find("main.include"), std::string::npos);
  EXPECT_NE(r.unconverted[1].find("vm.dirty_ratio"), std::string::npos);
  EXPECT_NE(r.unconverted[2].find("disk.readahead"), std::string::npos);
}

}  // namespace
}  // namespace weft::sidekick
