// CgroupTree against a fake cgroupfs tree: layout, controller handling, limit writes.
// Memory, cpu, pids and io limits cannot be enforced on the development machine (see
// ../shared/TESTING.md); here we check that exactly the right values reach the right
// files, through the same code the agent runs.
#include "agent/cgroup.h"
#include "testing/fake_cgroupfs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {
namespace {

class FakeTree : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::temp_directory_path() / ("weft-cg-" + random_hex(6));
    root_ = base_ + "/cg/weft";
    ASSERT_TRUE(mkdir_p(base_ + "/cg").ok());
    ASSERT_TRUE(mkdir_p(base_ + "/host/sys/kernel/mm/hugepages/hugepages-2048kB").ok());
    ASSERT_TRUE(mkdir_p(base_ + "/host/proc/self").ok());
    ASSERT_TRUE(
        write_file(base_ + "/host/proc/self/mountinfo", "1 0 0:1 / / rw - ext4 x rw\n").ok());
    fs_ = make_fake_cgroupfs();
    // The delegated root as systemd would hand it over.
    ASSERT_TRUE(fs_->mkdir(root_).ok());
  }
  void TearDown() override { (void)remove_tree(base_); }
  void give_controllers(const std::string& list) {
    ASSERT_TRUE(write_file(root_ + "/cgroup.controllers", list + "\n").ok());
  }
  std::string read(const std::string& rel) {
    return trim(read_file(root_ + "/" + rel).value_or("<missing>"));
  }

  std::string base_, root_;
  std::unique_ptr<CgroupFs> fs_;
};

TEST_F(FakeTree, SetupEnablesControllersAndMovesAgent) {
  give_controllers("cpuset cpu io memory hugetlb pids rdma misc");
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(4242).ok());
  EXPECT_EQ(read("agent/cgroup.procs"), "4242");
  EXPECT_EQ(read("cgroup.subtree_control"), "cpu cpuset hugetlb io memory pids");
  EXPECT_EQ(read("tasks/cgroup.subtree_control"), "cpu cpuset hugetlb io memory pids");
  EXPECT_EQ(t.controllers().size(), 6u);
  EXPECT_EQ(t.hugepage_sizes(), std::set<std::string>{"2MB"});
}

TEST_F(FakeTree, ProcessesInTheRootMoveToAHolderLeaf) {
  give_controllers("pids");
  ASSERT_TRUE(write_file(root_ + "/cgroup.procs", "777\n").ok());  // systemd's keep-alive process
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(0).ok());
  EXPECT_EQ(read("holder/cgroup.procs"), "777");
  EXPECT_FALSE(path_exists(root_ + "/agent"));  // the agent stays in its own unit
  EXPECT_EQ(read("tasks/cgroup.subtree_control"), "pids");
}

TEST_F(FakeTree, AllLimitsWrittenBeforeStart) {
  give_controllers("cpuset cpu io memory hugetlb pids");
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(0).ok());
  auto spec = parse_task_spec({{"name", "t"},
                               {"argv", {"true"}},
                               {"resources",
                                {{"cpu", 0.5},
                                 {"cpu_weight", 300},
                                 {"memory_max", "256M"},
                                 {"memory_high", "192M"},
                                 {"memory_swap_max", 0},
                                 {"pids_max", 64},
                                 {"io_max", {{{"device", "8:0"}, {"rbps", "1M"}, {"wiops", 50}}}},
                                 {"hugetlb", {{"2M", "64M"}}},
                                 {"cpuset_cpus", "0-1"},
                                 {"cpuset_mems", "0"}}}});
  ASSERT_TRUE(spec.ok());
  auto plan = plan_limits(spec->resources, t.controllers(), t.hugepage_sizes());
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  EXPECT_TRUE(plan->warnings.empty());
  ASSERT_TRUE(t.create_task("abc", plan->apply).ok());
  EXPECT_EQ(read("tasks/abc/cpu.max"), "50000 100000");
  EXPECT_EQ(read("tasks/abc/cpu.weight"), "300");
  EXPECT_EQ(read("tasks/abc/memory.max"), "268435456");
  EXPECT_EQ(read("tasks/abc/memory.high"), "201326592");
  EXPECT_EQ(read("tasks/abc/memory.swap.max"), "0");
  EXPECT_EQ(read("tasks/abc/memory.oom.group"), "1");
  EXPECT_EQ(read("tasks/abc/pids.max"), "64");
  EXPECT_EQ(read("tasks/abc/io.max"), "8:0 rbps=1048576 wiops=50");
  EXPECT_EQ(read("tasks/abc/hugetlb.2MB.max"), "67108864");
  EXPECT_EQ(read("tasks/abc/cpuset.cpus"), "0-1");
  EXPECT_EQ(read("tasks/abc/cpuset.mems"), "0");
  EXPECT_EQ(read("tasks/abc/cgroup.procs"), "");  // nothing has entered yet
  auto ids = t.task_ids();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<std::string>{"abc"});
  ASSERT_TRUE(t.remove_task("abc").ok());
  EXPECT_FALSE(path_exists(root_ + "/tasks/abc"));
}

TEST_F(FakeTree, MissingControllerIsAnErrorNamingTheField) {
  give_controllers("hugetlb");
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(0).ok());
  auto spec = parse_task_spec({{"name", "t"},
                               {"argv", {"true"}},
                               {"resources", {{"memory_max", "64M"}, {"pids_max", 10}}}});
  ASSERT_TRUE(spec.ok());
  auto plan = plan_limits(spec->resources, t.controllers(), t.hugepage_sizes());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().field, "resources.memory_max");
  EXPECT_NE(plan.error().message.find("available: hugetlb"), std::string::npos);

  spec->resources.best_effort = true;
  auto be = plan_limits(spec->resources, t.controllers(), t.hugepage_sizes());
  ASSERT_TRUE(be.ok());
  EXPECT_TRUE(be->apply.empty());
  ASSERT_EQ(be->warnings.size(), 2u);
  EXPECT_NE(be->warnings[0].find("resources.memory_max"), std::string::npos);
  EXPECT_NE(be->warnings[1].find("resources.pids_max"), std::string::npos);
}

TEST_F(FakeTree, UnsupportedHugepageSize) {
  give_controllers("hugetlb");
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(0).ok());
  auto spec = parse_task_spec(
      {{"name", "t"}, {"argv", {"true"}}, {"resources", {{"hugetlb", {{"1G", "1G"}}}}}});
  ASSERT_TRUE(spec.ok());
  auto plan = plan_limits(spec->resources, t.controllers(), t.hugepage_sizes());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().field, "resources.hugetlb.1GB");
}

TEST_F(FakeTree, FailedWriteLeavesNoCgroup) {
  give_controllers("memory");
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(0).ok());
  // A directory where the limit file should be makes the write fail like a kernel EINVAL.
  ASSERT_TRUE(fs_->mkdir(root_ + "/tasks/x").ok());
  ASSERT_TRUE(mkdir_p(root_ + "/tasks/x/memory.max").ok());
  auto s = t.create_task("x", {{"memory.max", "1", "memory", "resources.memory_max"}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().field, "resources.memory_max");
  EXPECT_FALSE(path_exists(root_ + "/tasks/x"));
}

TEST_F(FakeTree, FreezeKillAndStats) {
  give_controllers("memory pids cpu");
  CgroupTree t(*fs_, root_, HostPaths(base_ + "/host"));
  ASSERT_TRUE(t.setup(0).ok());
  ASSERT_TRUE(t.create_task("s", {}).ok());
  ASSERT_TRUE(t.freeze_task("s", true).ok());
  EXPECT_TRUE(*t.frozen("s"));
  ASSERT_TRUE(t.freeze_task("s", false).ok());
  EXPECT_FALSE(*t.frozen("s"));
  std::string d = root_ + "/tasks/s/";
  ASSERT_TRUE(
      write_file(
          d + "cpu.stat",
          "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_throttled 7\nthrottled_usec 9000\n")
          .ok());
  ASSERT_TRUE(write_file(d + "memory.current", "4096\n").ok());
  ASSERT_TRUE(write_file(d + "memory.peak", "8192\n").ok());
  ASSERT_TRUE(write_file(d + "pids.current", "3\n").ok());
  ASSERT_TRUE(write_file(d + "memory.events", "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n").ok());
  ASSERT_TRUE(write_file(d + "cpu.pressure",
                         "some avg10=1.50 avg60=0.00 avg300=0.00 total=123\nfull avg10=0.00 "
                         "avg60=0.00 avg300=0.00 total=4\n")
                  .ok());
  auto st = t.stats("s").to_json();
  EXPECT_EQ(st["cpu_usage_usec"], 1500);
  EXPECT_EQ(st["cpu_nr_throttled"], 7);
  EXPECT_EQ(st["cpu_throttled_usec"], 9000);
  EXPECT_EQ(st["memory_peak"], 8192);
  EXPECT_EQ(st["pids_current"], 3);
  EXPECT_EQ(st["pressure"]["cpu"]["some"]["total"], 123);
  EXPECT_DOUBLE_EQ(st["pressure"]["cpu"]["some"]["avg10"].get<double>(), 1.5);
  EXPECT_EQ(*t.oom_kills("s"), 1u);
  ASSERT_TRUE(write_file(d + "cgroup.procs", "77\n").ok());
  EXPECT_FALSE(fs_->rmdir(root_ + "/tasks/s").ok());  // busy while populated
  ASSERT_TRUE(t.remove_task("s").ok());               // cgroup.kill empties it first
  EXPECT_FALSE(path_exists(root_ + "/tasks/s"));
}

TEST(LimitWrites, OrderHighBeforeMax) {
  TaskResources r;
  r.memory_max = 100;
  r.memory_high = 50;
  auto w = limit_writes(r);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].file, "memory.high");
  EXPECT_EQ(w[1].file, "memory.max");
}

}  // namespace
}  // namespace weft::agent
