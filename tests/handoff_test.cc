// A sandbox's weft-init (`weft-init --await-task`, agent/init/handoff.h) handed a
// message that is not a task's start: it exits 125 at once, without waiting for more,
// and without touching the task directory it may have been given. The agent is the only
// writer on that socket, but weft-init parses it as hostile all the same. No root
// needed: weft-init waits on fd 3 before it does anything a sandbox's namespaces need.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/init/handoff.h"
#include "agent/sandbox_pool.h"
#include "common/fs.h"

namespace weft::agent {
namespace {

using handoff::Header;

class AwaitingInit : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/weft-handoff-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    dir_fd_ = Fd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(dir_fd_.valid());
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    sock_ = Fd(sv[0]);
    Fd theirs(sv[1]);
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      // fd 3, without close-on-exec (dup2 onto itself would keep the flag).
      if (theirs.get() == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup2(theirs.get(), 3) < 0) _exit(126);
      ::execl(WEFT_INIT_BIN, "weft-init", "--await-task", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Sends `bytes` with `fds` as SCM_RIGHTS on the first byte (none when empty).
  void send(const std::string& bytes, const std::vector<int>& fds) {
    struct iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
    struct msghdr m;
    std::memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    std::vector<char> ctl(CMSG_SPACE(sizeof(int) * fds.size()));
    if (!fds.empty()) {
      m.msg_control = ctl.data();
      m.msg_controllen = ctl.size();
      struct cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ASSERT_EQ(::sendmsg(sock_.get(), &m, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  static std::string header(uint32_t magic, uint32_t body_len, uint32_t argc, uint32_t nfds) {
    Header h{magic, body_len, argc, nfds};
    return std::string(reinterpret_cast<const char*>(&h), sizeof h);
  }
  // weft-init's exit status, or -1 if it is still running after `ms`.
  int exit_status(int ms = 5000) {
    for (int i = 0; i < ms; ++i) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      ::usleep(1000);
    }
    return -1;
  }
  // Asserts weft-init refused what it was sent without waiting for the socket to close:
  // exit 125 while the agent's end is still open, and the task directory untouched.
  void expect_refused_at_once() {
    EXPECT_EQ(exit_status(), 125);
    expect_untouched();
  }
  void expect_untouched() {
    EXPECT_TRUE(std::filesystem::is_empty(dir_)) << dir_ << " was written to";
  }

  std::string dir_;
  Fd dir_fd_, sock_;
  pid_t pid_ = -1;
};

TEST_F(AwaitingInit, TheAgentGoingAwayEndsItWithNothingDone) {
  sock_.reset();
  EXPECT_EQ(exit_status(), 125);
  expect_untouched();
}

TEST_F(AwaitingInit, AnotherMagicIsRefused) {
  std::string body = std::string("weft-init") + '\0';
  send(header(0x32544657, static_cast<uint32_t>(body.size()), 1, 1) + body, {dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, ABodyOverTheLimitIsRefusedBeforeItIsRead) {
  send(header(handoff::kMagic, handoff::kMaxBody + 1, 1, 1), {dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, TooManyArgumentsAreRefused) {
  send(header(handoff::kMagic, 16, handoff::kMaxArgs + 1, 1), {dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, AHeaderWithoutItsDescriptorIsRefused) {
  send(handoff_message({"weft-init", "/bin/true"}, 1), {});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, MoreDescriptorsThanTheHeaderSaysAreRefused) {
  send(handoff_message({"weft-init", "/bin/true"}, 1), {dir_fd_.get(), dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, MoreDescriptorsThanAnyTaskHasAreRefused) {
  send(handoff_message({"weft-init", "/bin/true"}, 2),
       {dir_fd_.get(), dir_fd_.get(), dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, ABodyWithOtherThanItsArgumentCountIsRefused) {
  std::string msg = handoff_message({"weft-init", "/bin/true"}, 1);
  ASSERT_FALSE(msg.empty());
  Header h;
  std::memcpy(&h, msg.data(), sizeof h);
  h.argc = 3;
  std::memcpy(msg.data(), &h, sizeof h);
  send(msg, {dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, ABodyWhoseLastStringIsNotTerminatedIsRefused) {
  std::string body = std::string("weft-init") + '\0' + "/bin/true";
  send(header(handoff::kMagic, static_cast<uint32_t>(body.size()), 2, 1) + body, {dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, ABodyCutShortEndsItWhenTheAgentGoesAway) {
  std::string msg = handoff_message({"weft-init", "/bin/true"}, 1);
  send(msg.substr(0, msg.size() - 3), {dir_fd_.get()});
  EXPECT_EQ(exit_status(200), -1) << "it did not wait for the rest of the body";
  sock_.reset();
  EXPECT_EQ(exit_status(), 125);
  expect_untouched();
}

// Only a task's own start is handed off: not a second wait, not a join of another
// task's namespaces.
TEST_F(AwaitingInit, ASecondWaitIsRefused) {
  send(handoff_message({"weft-init", "--await-task"}, 1), {dir_fd_.get()});
  expect_refused_at_once();
}

TEST_F(AwaitingInit, AJoinIsRefused) {
  send(handoff_message({"weft-init", "--join-pid", "1", "/bin/true"}, 1), {dir_fd_.get()});
  expect_refused_at_once();
}

// The control: what the cases above check would be seen. A well-formed hand-off is taken
// and weft-init goes on with the task's start in the directory it was handed (its logs/
// and exit record), whether or not this user may then confine the task.
TEST_F(AwaitingInit, AWellFormedHandOffIsTakenAndTouchesTheTaskDirectory) {
  send(handoff_message({"weft-init", "--task-dir-fd", "3", "--incarnation", "1", "--", "/bin/true"},
                       1),
       {dir_fd_.get()});
  EXPECT_NE(exit_status(), -1);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/logs"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/exit"));
}

}  // namespace
}  // namespace weft::agent
