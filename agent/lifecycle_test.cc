#include "agent/lifecycle.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

namespace weft::agent {
namespace {

TaskSpec spec_with(RestartPolicy p, int64_t max_restarts = -1) {
  TaskSpec s;
  s.name = "t";
  s.argv = {"/bin/app"};
  s.restart.policy = p;
  s.restart.max_restarts = max_restarts;
  s.restart.delay_us = 1'000'000;
  s.restart.max_delay_us = 8'000'000;
  s.restart.reset_after_us = 60'000'000;
  return s;
}

ExitFacts exited(int code) {
  ExitFacts f;
  f.record = ExitRecord{1, code << 8, 0, "", ""};
  return f;
}

ExitFacts killed(int sig, bool core = false) {
  ExitFacts f;
  f.record = ExitRecord{1, sig | (core ? 0x80 : 0), 0, "", ""};
  return f;
}

TEST(DecideExit, CleanExit) {
  auto o = decide_exit(exited(0), spec_with(RestartPolicy::kOnFailure));
  EXPECT_EQ(o.state, TaskState::kExited);
  EXPECT_EQ(*o.exit_code, 0);
  EXPECT_FALSE(o.restart);
  EXPECT_EQ(o.reason, "");
}

TEST(DecideExit, FailureRestartsWithBackoff) {
  auto f = exited(3);
  auto o = decide_exit(f, spec_with(RestartPolicy::kOnFailure));
  EXPECT_EQ(o.state, TaskState::kBackoff);
  EXPECT_EQ(o.reason, "exited with code 3");
  EXPECT_TRUE(o.restart);
  EXPECT_EQ(o.backoff_us, 1'000'000);
  f.backoff_us = 1'000'000;
  f.ran_us = 100;
  EXPECT_EQ(decide_exit(f, spec_with(RestartPolicy::kOnFailure)).backoff_us, 2'000'000);
  f.backoff_us = 8'000'000;
  EXPECT_EQ(decide_exit(f, spec_with(RestartPolicy::kOnFailure)).backoff_us, 8'000'000);  // capped
  f.ran_us = 60'000'000;
  EXPECT_EQ(decide_exit(f, spec_with(RestartPolicy::kOnFailure)).backoff_us, 1'000'000);  // reset
}

TEST(DecideExit, PolicyNeverAndAlways) {
  EXPECT_EQ(decide_exit(exited(1), spec_with(RestartPolicy::kNever)).state, TaskState::kFailed);
  auto a = decide_exit(exited(0), spec_with(RestartPolicy::kAlways));
  EXPECT_TRUE(a.restart);
  EXPECT_EQ(a.state, TaskState::kBackoff);
}

TEST(DecideExit, RestartLimit) {
  auto f = exited(1);
  f.restarts = 3;
  auto o = decide_exit(f, spec_with(RestartPolicy::kAlways, 3));
  EXPECT_FALSE(o.restart);
  EXPECT_EQ(o.state, TaskState::kFailed);
  EXPECT_EQ(o.reason, "exited with code 1; restart limit reached");
}

TEST(DecideExit, SignalsAndCoreDumps) {
  auto o = decide_exit(killed(SIGSEGV, true), spec_with(RestartPolicy::kNever));
  EXPECT_EQ(*o.signal, SIGSEGV);
  EXPECT_TRUE(o.core_dumped);
  EXPECT_EQ(o.reason, "killed by SIGSEGV (core dumped)");
  EXPECT_FALSE(o.exit_code);
}

TEST(DecideExit, OomKillIsAFailureWhateverTheStatus) {
  auto f = killed(SIGKILL);
  f.oom_killed = true;
  auto o = decide_exit(f, spec_with(RestartPolicy::kOnFailure));
  EXPECT_TRUE(o.oom_killed);
  EXPECT_EQ(o.reason, "killed by the kernel OOM killer (memory limit reached)");
  EXPECT_TRUE(o.restart);
  auto g = exited(0);
  g.oom_killed = true;  // a child was OOM-killed, main still exited 0
  EXPECT_EQ(decide_exit(g, spec_with(RestartPolicy::kNever)).state, TaskState::kFailed);
}

TEST(DecideExit, ExecFailuresAreNotRestarted) {
  ExitFacts f;
  f.record = ExitRecord{1, 127 << 8, ENOENT, "exec", ""};
  auto o = decide_exit(f, spec_with(RestartPolicy::kAlways));
  EXPECT_EQ(o.state, TaskState::kFailed);
  EXPECT_FALSE(o.restart);
  EXPECT_EQ(o.reason, "cannot execute /bin/app: No such file or directory");
  f.record->exec_stage = "chdir";
  auto spec = spec_with(RestartPolicy::kNever);
  spec.cwd = "/nope";
  EXPECT_EQ(decide_exit(f, spec).reason,
            "cannot change to working directory /nope: No such file or directory");
  ExitFacts s;
  s.record = ExitRecord{1, std::nullopt, 0, "", "pivot_root: Invalid argument"};
  EXPECT_EQ(decide_exit(s, spec).reason, "task setup failed: pivot_root: Invalid argument");
}

TEST(DecideExit, StopRequestedWins) {
  auto f = killed(SIGTERM);
  f.stop_requested = true;
  auto o = decide_exit(f, spec_with(RestartPolicy::kAlways));
  EXPECT_EQ(o.state, TaskState::kStopped);
  EXPECT_FALSE(o.restart);
  EXPECT_EQ(*o.signal, SIGTERM);
}

TEST(DecideExit, NoRecord) {
  ExitFacts f;  // adopted task whose init vanished; agent killed the cgroup
  f.kill_sent = true;
  f.stop_requested = true;
  auto o = decide_exit(f, spec_with(RestartPolicy::kNever));
  EXPECT_EQ(*o.signal, SIGKILL);
  ExitFacts g;
  g.init_status = SIGKILL;  // our child, killed from outside
  EXPECT_EQ(*decide_exit(g, spec_with(RestartPolicy::kNever)).signal, SIGKILL);
  ExitFacts h;
  h.prior_reason = "agent restarted while starting the task";
  auto oh = decide_exit(h, spec_with(RestartPolicy::kNever));
  EXPECT_EQ(oh.state, TaskState::kFailed);
  EXPECT_EQ(oh.reason, "agent restarted while starting the task");
  ExitFacts u;
  EXPECT_EQ(decide_exit(u, spec_with(RestartPolicy::kNever)).reason,
            "weft-init ended without recording an exit status");
}

TEST(ExitRecordParse, Fields) {
  auto r = parse_exit_record("incarnation=3\nstatus=256\n");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->incarnation, 3u);
  EXPECT_EQ(*r->status, 256);
  auto e = parse_exit_record("incarnation=1\nexec_errno=2\nexec_stage=chdir\n");
  EXPECT_EQ(e->exec_errno, 2);
  EXPECT_EQ(e->exec_stage, "chdir");
  EXPECT_FALSE(parse_exit_record("garbage"));
  // What a record that never reached the disk looks like after a power loss.
  EXPECT_FALSE(parse_exit_record(""));
  EXPECT_FALSE(parse_exit_record(std::string(4096, '\0')));
}

}  // namespace
}  // namespace weft::agent
