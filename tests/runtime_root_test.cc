// spawn_init() on the real cgroup2 tree, through its three paths: the posix_spawn-like
// clone3 (CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP), a fork-style clone3 into the
// cgroup, and a fork-style clone whose child joins cgroup.procs before it executes
// anything (the fallback where clone3 is refused); and the network namespaces made ahead
// of time (NetnsPool).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <thread>

#include "agent/identity.h"
#include "agent/init/argv.h"
#include "agent/manager.h"
#include "agent/netns_pool.h"
#include "agent/spawn.h"
#include "common/fs.h"
#include "common/paths.h"
#include "common/strings.h"
#include "tests/agent_harness.h"

namespace weft::agent {
namespace {

class SpawnTest : public ::testing::TestWithParam<SpawnRequest::Mode> {
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
  // A request to start `spec`'s weft-init in this test's cgroup and directory.
  SpawnRequest request_for(const TaskSpec& spec, bool lo_up = false) {
    dirfd_ = Fd(open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    SpawnRequest req;
    req.init_path = WEFT_INIT_BIN;
    req.cgroup_dir = cg_;
    req.task_dir_fd = dirfd_.get();
    req.init_argv = init_argv(spec, Identity{}, InitStart{1, nullptr, {}, lo_up});
    req.mode = GetParam();
    return req;
  }
  std::string cg_, dir_;
  Fd dirfd_;
};

TEST_P(SpawnTest, ChildIsInCgroupBeforeItRuns) {
  auto spec = parse_task_spec(
      {{"name", "t"}, {"argv", {"sh", "-c", "grep ^0:: /proc/self/cgroup; exit 4"}}});
  ASSERT_TRUE(spec.ok());
  auto s = spawn_init(request_for(*spec));
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->used, GetParam());
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
  SpawnRequest req = request_for(TaskSpec{});
  req.init_path = "/no/such/weft-init";
  auto s = spawn_init(req);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum, ENOENT);
}

std::string ns_link(const std::string& path) {
  char buf[64] = {};
  ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string ns_of_fd(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? "net:[" + std::to_string(st.st_ino) + "]" : "";
}

// The child enters a namespace made ahead of time (the NetnsPool's) instead of a new one.
TEST_P(SpawnTest, ChildEntersTheNetworkNamespaceItIsGiven) {
  NetnsPool pool(1);
  Fd ns;
  for (int i = 0; i < 500 && !ns.valid(); ++i) {
    ns = pool.take();
    if (!ns.valid()) usleep(10000);
  }
  ASSERT_TRUE(ns.valid()) << pool.failure();
  auto spec = parse_task_spec({{"name", "t"},
                               {"argv", {"sh", "-c", "readlink /proc/self/ns/net"}},
                               {"namespaces", {{"network", "private"}}}});
  ASSERT_TRUE(spec.ok());
  SpawnRequest req = request_for(*spec, true);
  req.new_net = false;
  req.netns_fd = ns.get();
  auto s = spawn_init(req);
  ASSERT_TRUE(s.ok()) << s.error().str();
  int status = 0;
  ASSERT_EQ(waitpid(s->pid, &status, 0), s->pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::string want = ns_of_fd(ns.get());
  ASSERT_FALSE(want.empty());
  EXPECT_NE(want, ns_link("/proc/self/ns/net"));
  EXPECT_EQ(read_file(dir_ + "/logs/stdout.00000001.log").value_or(""), want + "\n");
}

// Where clone3 is refused (a kernel before 5.3, or a seccomp policy around the agent, as
// container runtimes' default profiles had), a start falls back to the fork-style path,
// says so in `used`, and later starts go there directly. The refusal is a seccomp filter
// in a child process of the test, so the test's own process is untouched.
TEST_P(SpawnTest, FallsBackToAForkStyleStartWhereClone3IsRefused) {
  auto spec = parse_task_spec(
      {{"name", "t"}, {"argv", {"sh", "-c", "grep ^0:: /proc/self/cgroup; exit 4"}}});
  ASSERT_TRUE(spec.ok());
  SpawnRequest req = request_for(*spec);
  pid_t p = fork();
  ASSERT_GE(p, 0);
  if (p == 0) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
      _exit(20);
    for (int i = 0; i < 2; ++i) {  // the second start goes straight to the fork-style path
      auto s = spawn_init(req);
      if (!s.ok()) _exit(21);
      if (s->used != SpawnRequest::Mode::kFork) _exit(22);
      int status = 0;
      if (waitpid(s->pid, &status, 0) != s->pid || !WIFEXITED(status) || WEXITSTATUS(status) != 4)
        _exit(23);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(p, &status, 0), p);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "20: no seccomp, 21: start failed, 22: not the fork-style "
                                       "path, 23: the task did not run";
  std::string rel = cg_.substr(HostPaths().cgroup2_mount()->size());
  EXPECT_EQ(read_file(dir_ + "/logs/stdout.00000001.log").value_or(""), "0::" + rel + "\n");
  // This process's own starts still use the path asked for.
  auto s = spawn_init(request_for(*spec));
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->used, GetParam());
  ASSERT_EQ(waitpid(s->pid, &status, 0), s->pid);
}

INSTANTIATE_TEST_SUITE_P(Paths, SpawnTest,
                         ::testing::Values(SpawnRequest::Mode::kVfork, SpawnRequest::Mode::kClone3,
                                           SpawnRequest::Mode::kFork),
                         [](const auto& p) {
                           return p.param == SpawnRequest::Mode::kVfork    ? "Vfork"
                                  : p.param == SpawnRequest::Mode::kClone3 ? "Clone3"
                                                                           : "Fork";
                         });

// Namespaces made ahead: fresh, distinct, loopback up, refilled, and no thread of the
// process left in one.
TEST(NetnsPool, KeepsFreshNamespacesWithTheLoopbackUp) {
  std::string why = testing::root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  std::string own = ns_link("/proc/self/ns/net");
  ASSERT_FALSE(own.empty());
  {
    NetnsPool pool(2);
    for (int i = 0; i < 500 && pool.ready() < 2; ++i) usleep(10000);
    ASSERT_EQ(pool.ready(), 2u) << pool.failure();
    Fd a = pool.take(), b = pool.take();
    ASSERT_TRUE(a.valid() && b.valid());
    EXPECT_NE(ns_of_fd(a.get()), ns_of_fd(b.get()));
    EXPECT_NE(ns_of_fd(a.get()), own);
    for (int fd : {a.get(), b.get()}) {
      pid_t p = fork();
      if (p == 0) {
        if (setns(fd, CLONE_NEWNET) < 0) _exit(2);
        int sock = socket(AF_INET, SOCK_DGRAM, 0);
        struct ifreq ifr {};
        std::strcpy(ifr.ifr_name, "lo");
        if (sock < 0 || ioctl(sock, SIOCGIFFLAGS, &ifr) < 0) _exit(3);
        _exit((ifr.ifr_flags & IFF_UP) ? 0 : 4);
      }
      int status = 0;
      ASSERT_EQ(waitpid(p, &status, 0), p);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "lo not up: " << status;
    }
    for (int i = 0; i < 500 && pool.ready() < 2; ++i) usleep(10000);
    EXPECT_EQ(pool.ready(), 2u);  // refilled
    // Every thread of this process (the pool's included) is in its own namespace.
    for (const auto& tid : list_dir("/proc/self/task").value_or(std::vector<std::string>{}))
      EXPECT_EQ(ns_link("/proc/self/task/" + tid + "/ns/net"), own) << "thread " << tid;
    EXPECT_TRUE(pool.failure().empty());
  }
  NetnsPool none(0);
  EXPECT_FALSE(none.take().valid());
  EXPECT_EQ(none.ready(), 0u);
}

}  // namespace
}  // namespace weft::agent
