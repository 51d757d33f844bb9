// spawn_init() on the real cgroup2 tree, through both spawn paths: clone3 with
// CLONE_INTO_CGROUP and the fallback for kernels without it (clone, then the child
// joins cgroup.procs before it executes anything).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "agent/manager.h"
#include "agent/runtime.h"
#include "common/fs.h"
#include "common/paths.h"
#include "tests/agent_harness.h"

namespace weft::agent {
namespace {

class SpawnTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string why = testing::root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    cg_ = *HostPaths().cgroup2_mount() + "/weft-spawn-test-" + random_hex(5);
    ASSERT_EQ(mkdir(cg_.c_str(), 0755), 0);
    dir_ = std::filesystem::temp_directory_path() / ("weft-spawn-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
  }
  void TearDown() override {
    if (!cg_.empty()) testing::destroy_cgroup_tree(cg_);
    if (!dir_.empty()) (void)remove_tree(dir_);
  }
  std::string cg_, dir_;
};

TEST_P(SpawnTest, ChildIsInCgroupBeforeItRuns) {
  auto spec = parse_task_spec(
      {{"name", "t"}, {"argv", {"sh", "-c", "grep ^0:: /proc/self/cgroup; exit 4"}}});
  ASSERT_TRUE(spec.ok());
  Fd dirfd(open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  SpawnRequest req;
  req.init_path = WEFT_INIT_BIN;
  req.cgroup_dir = cg_;
  req.task_dir_fd = dirfd.get();
  req.init_argv = build_init_argv(*spec, Identity{}, 1);
  req.force_fallback = GetParam();
  auto s = spawn_init(req);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->used_clone3, !GetParam());
  int status = 0;
  ASSERT_EQ(waitpid(s->pid, &status, 0), s->pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4);
  auto rec = parse_exit_record(read_file(dir_ + "/exit").value_or(""));
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->incarnation, 1u);
  ASSERT_TRUE(rec->status);
  EXPECT_EQ(WEXITSTATUS(*rec->status), 4);
  std::string rel = cg_.substr(HostPaths().cgroup2_mount()->size());
  EXPECT_EQ(read_file(dir_ + "/logs/stdout.00000001.log").value_or(""), "0::" + rel + "\n");
}

TEST_P(SpawnTest, BadInitPathIsASynchronousError) {
  Fd dirfd(open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  SpawnRequest req;
  req.init_path = "/no/such/weft-init";
  req.cgroup_dir = cg_;
  req.task_dir_fd = dirfd.get();
  req.init_argv = {"weft-init"};
  req.force_fallback = GetParam();
  auto s = spawn_init(req);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum, ENOENT);
}

INSTANTIATE_TEST_SUITE_P(Paths, SpawnTest, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Fallback" : "Clone3"; });

}  // namespace
}  // namespace weft::agent
