// Probes against fake /proc and /sys trees.
#include "hcs/probes.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include "common/clock.h"
#include "common/fs.h"
#include "common/strings.h"

namespace weft::hcs {
namespace {

class FakeTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("weft-hcs-" + random_hex(5));
  }
  void TearDown() override { (void)remove_tree(root_); }
  void put(const std::string& rel, const std::string& v) {
    ASSERT_TRUE(mkdir_p(dirname_of(root_ + "/" + rel)).ok());
    ASSERT_TRUE(write_file(root_ + "/" + rel, v).ok());
  }
  HostPaths host() { return HostPaths(root_); }
  std::string root_;
};

TEST_F(FakeTree, Psi) {
  auto p = make_psi_probe(host(), "memory", 10, 30);
  EXPECT_EQ(p->run(0).health, Health::kUnknown);  // no PSI is not OK
  put("proc/pressure/memory",
      "some avg10=2.00 avg60=1.00 avg300=0.50 total=100\nfull avg10=0.50 avg60=0 avg300=0 "
      "total=5\n");
  EXPECT_EQ(p->run(0).health, Health::kOk);
  put("proc/pressure/memory",
      "some avg10=15.00 avg60=1.00 avg300=0.50 total=100\nfull avg10=5.00 avg60=0 avg300=0 "
      "total=5\n");
  EXPECT_EQ(p->run(0).health, Health::kDegraded);
  put("proc/pressure/memory",
      "some avg10=60.00 avg60=1.00 avg300=0.50 total=100\nfull avg10=40.00 avg60=0 avg300=0 "
      "total=5\n");
  auto s = p->run(0);
  EXPECT_EQ(s.health, Health::kFailed);
  EXPECT_EQ(s.detail, "memory pressure 40.0% over 10 s");
  EXPECT_DOUBLE_EQ(s.metrics["full_avg10"].get<double>(), 40.0);
}

TEST_F(FakeTree, DiskSpaceInodesAndReadOnlyRemount) {
  put("proc/self/mountinfo",
      "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n30 22 8:2 / /data rw,relatime - xfs /dev/sdb1 "
      "rw\n");
  struct statvfs fake {};
  fake.f_blocks = 1000;
  fake.f_bavail = 500;
  fake.f_files = 100;
  fake.f_favail = 50;
  auto statfs = [&](const std::string&, struct statvfs* o) {
    *o = fake;
    return 0;
  };
  auto p = make_disk_probe(host(), "/data", 10, 5, statfs);
  EXPECT_EQ(p->run(0).health, Health::kOk);
  fake.f_bavail = 80;  // 8% free
  EXPECT_EQ(p->run(0).health, Health::kDegraded);
  fake.f_bavail = 20;  // 2% free
  EXPECT_EQ(p->run(0).health, Health::kFailed);
  fake.f_bavail = 500;
  fake.f_favail = 2;  // inodes exhausted
  EXPECT_EQ(p->run(0).health, Health::kFailed);
  fake.f_favail = 50;
  // ext4/xfs remounted read-only after errors: a new mountinfo entry on top.
  put("proc/self/mountinfo",
      "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n30 22 8:2 / /data ro,relatime - xfs /dev/sdb1 ro\n");
  auto s = p->run(0);
  EXPECT_EQ(s.health, Health::kFailed);
  EXPECT_EQ(s.detail, "/data is mounted read-only");
  // weft-hcs's own sandbox (ProtectSystem=strict) makes every mount read-only for it:
  // the filesystem is writable, the machine healthy.
  put("proc/self/mountinfo",
      "22 1 8:1 / / ro,relatime - ext4 /dev/sda1 rw\n30 22 8:2 / /data ro,nosuid shared:5 - xfs "
      "/dev/sdb1 rw,attr2\n");
  EXPECT_EQ(p->run(0).health, Health::kOk);
  EXPECT_EQ(make_disk_probe(host(), "/nope", 10, 5, statfs)->run(0).health, Health::kFailed);
}

TEST_F(FakeTree, LinkCarrierAndFlaps) {
  auto p = make_link_probe(host(), "eth0", 2, 100'000'000);
  EXPECT_EQ(p->run(0).health, Health::kUnknown);  // no such link
  put("sys/class/net/eth0/carrier", "1\n");
  EXPECT_EQ(p->run(1).health, Health::kOk);
  put("sys/class/net/eth0/carrier", "0\n");
  EXPECT_EQ(p->run(2).health, Health::kFailed);
  put("sys/class/net/eth0/carrier", "1\n");
  EXPECT_EQ(p->run(3).health, Health::kOk);
  put("sys/class/net/eth0/carrier", "0\n");
  p->run(4);
  put("sys/class/net/eth0/carrier", "1\n");
  auto s = p->run(5);
  EXPECT_EQ(s.health, Health::kDegraded);  // up, but flapping
}

TEST(KmsgProbeTest, WindowsAndLatch) {
  KmsgProbe p(100, 3);
  EXPECT_EQ(p.run(0).health, Health::kOk);
  p.observe(*parse_kmsg_record("3,1,1,-;Memory cgroup out of memory: Killed process 1 (dd)"), 1);
  EXPECT_EQ(p.run(1).health, Health::kOk);  // a task's own limit: not the machine's problem
  p.observe(*parse_kmsg_record("3,2,1,-;Out of memory: Killed process 2 (x)"), 2);
  EXPECT_EQ(p.run(2).health, Health::kDegraded);
  EXPECT_EQ(p.run(200).health, Health::kOk);  // slid out of the window: not latched
  for (int i = 0; i < 3; ++i)
    p.observe(*parse_kmsg_record("3,3,1,-;I/O error, dev sdb, sector 1 op 0x0:(READ)"), 300);
  EXPECT_EQ(p.run(300).health, Health::kFailed);
  p.observe(*parse_kmsg_record("2,4,1,-;mce: [Hardware Error]: Machine check events logged"), 400);
  EXPECT_EQ(p.run(10'000).health, Health::kFailed);  // latched long after the window
  p.clear_latch();
  EXPECT_EQ(p.run(10'000).health, Health::kOk);
}

TEST(ExecProbeTest, ExitCodesOutputAndTimeout) {
  EXPECT_EQ(make_exec_probe("ok", {"sh", "-c", "echo fine"}, 5'000'000)->run(0).health,
            Health::kOk);
  auto d = make_exec_probe("deg", {"sh", "-c", "echo 'fan slow'; exit 1"}, 5'000'000)->run(0);
  EXPECT_EQ(d.health, Health::kDegraded);
  EXPECT_EQ(d.detail, "fan slow");
  EXPECT_EQ(make_exec_probe("bad", {"sh", "-c", "exit 2"}, 5'000'000)->run(0).health,
            Health::kFailed);
  EXPECT_EQ(make_exec_probe("weird", {"sh", "-c", "exit 7"}, 5'000'000)->run(0).health,
            Health::kFailed);
  auto t = make_exec_probe("slow", {"sh", "-c", "sleep 5 & sleep 5"}, 200'000)->run(0);
  EXPECT_EQ(t.health, Health::kFailed);
  EXPECT_NE(t.detail.find("timed out"), std::string::npos);
  EXPECT_EQ(make_exec_probe("missing", {"/no/such/probe"}, 1'000'000)->run(0).health,
            Health::kFailed);
}

}  // namespace
}  // namespace weft::hcs

namespace weft::hcs {
namespace {

// On the event loop a script runs while the loop goes on: a timer set for 50 ms fires
// before a 300 ms script reports, and the script's verdict arrives through the loop.
TEST(ExecProbeTest, RunsOffTheEventLoop) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto p = make_exec_probe("slow", {"sh", "-c", "sleep 0.3; echo 'disk slow'; exit 1"}, 5'000'000);
  std::optional<Sample> got;
  bool timer_first = false;
  uint64_t t0 = now_monotonic_us();
  p->start(**loop, 0, [&](Sample s) { got = s; });
  EXPECT_FALSE(got);  // not yet: it is running
  auto t = (*loop)->add_timer_in(50'000, [&] { timer_first = !got; });
  ASSERT_TRUE(t.ok());
  while (!got && now_monotonic_us() - t0 < 5'000'000) ASSERT_TRUE((*loop)->run_once(100'000).ok());
  ASSERT_TRUE(got);
  EXPECT_TRUE(timer_first);
  EXPECT_EQ(got->health, Health::kDegraded);
  EXPECT_EQ(got->detail, "disk slow");

  // A script past its timeout is killed with its process group and is FAILED.
  auto hung = make_exec_probe("hung", {"sh", "-c", "sleep 30 & sleep 30"}, 200'000);
  got.reset();
  t0 = now_monotonic_us();
  hung->start(**loop, 0, [&](Sample s) { got = s; });
  while (!got && now_monotonic_us() - t0 < 5'000'000) ASSERT_TRUE((*loop)->run_once(100'000).ok());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->health, Health::kFailed);
  EXPECT_NE(got->detail.find("timed out"), std::string::npos);
  EXPECT_LT(now_monotonic_us() - t0, 2'000'000u);

  // A missing program is FAILED (exit 127), not a hang.
  auto missing = make_exec_probe("missing", {"/no/such/probe"}, 1'000'000);
  got.reset();
  missing->start(**loop, 0, [&](Sample s) { got = s; });
  t0 = now_monotonic_us();
  while (!got && now_monotonic_us() - t0 < 5'000'000) ASSERT_TRUE((*loop)->run_once(100'000).ok());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->health, Health::kFailed);
}

}  // namespace
}  // namespace weft::hcs
