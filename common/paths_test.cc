#include "common/paths.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft {
namespace {

class FakeRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("weft-paths-" + random_hex(6));
    ASSERT_TRUE(mkdir_p(root_ + "/proc/self").ok());
  }
  void TearDown() override { (void)remove_tree(root_); }
  std::string root_;
};

TEST_F(FakeRoot, FindsHybridCgroup2Mount) {
  ASSERT_TRUE(
      write_file(root_ + "/proc/self/mountinfo",
                 "22 1 0:21 / /sys rw - sysfs sysfs rw\n"
                 "30 22 0:26 / /sys/fs/cgroup/memory rw shared:9 - cgroup cgroup rw,memory\n"
                 "31 22 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw\n")
          .ok());
  HostPaths hp(root_);
  auto m = hp.cgroup2_mount();
  ASSERT_TRUE(m.ok()) << m.error().str();
  EXPECT_EQ(*m, root_ + "/sys/fs/cgroup/unified");
  EXPECT_EQ(hp.proc("pressure/cpu"), root_ + "/proc/pressure/cpu");
}

TEST_F(FakeRoot, NoCgroup2IsAnError) {
  ASSERT_TRUE(
      write_file(root_ + "/proc/self/mountinfo", "22 1 0:21 / /sys rw - sysfs sysfs rw\n").ok());
  EXPECT_FALSE(HostPaths(root_).cgroup2_mount().ok());
}

TEST_F(FakeRoot, OwnCgroup) {
  ASSERT_TRUE(
      write_file(root_ + "/proc/self/cgroup", "4:memory:/x\n0::/system.slice/weft-agent.service\n")
          .ok());
  EXPECT_EQ(*HostPaths(root_).own_cgroup(), "/system.slice/weft-agent.service");
}

TEST(HostPathsReal, RootSlash) {
  HostPaths hp;
  EXPECT_EQ(hp.proc("self/stat"), "/proc/self/stat");
  EXPECT_EQ(hp.sys(), "/sys");
}

}  // namespace
}  // namespace weft
