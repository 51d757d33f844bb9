// For tests: a program under test (a weft daemon, etcd, a registry, a controller) as a
// child process that dies with the test process, even when that is killed or aborts
// (PR_SET_PDEATHSIG), with its output in a log file, optionally in a named network
// namespace. Every harness starts its children here.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace weft::testing {

struct SpawnOptions {
  std::string log;            // stdout and stderr go here ("": the test's own)
  bool truncate_log = false;  // else appended to
  std::string netns;          // runs in /run/netns/<netns> (root), or here
  // Not a systemd service's child: INVOCATION_ID and NOTIFY_SOCKET (which a test run
  // from a unit inherits) are unset, so the daemon neither logs to the journal nor
  // notifies the test's own unit.
  bool outside_systemd = false;
  std::map<std::string, std::string> env;  // set in the child
  std::vector<std::string> unset_env;      // unset in the child
  // Runs in the child before its output is redirected and the program executed (e.g. a
  // namespace of its own); false: the child exits 125.
  std::function<bool()> prepare;
};

// Forks and executes argv[0] with `argv`: the child's pid, or -1. A child that cannot
// enter the namespace exits 126; one whose program cannot run, 127.
inline pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::string netns = o.netns.empty() ? std::string() : "/run/netns/" + o.netns;
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!netns.empty()) {
    int ns = ::open(netns.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) ::_exit(126);
  }
  if (o.outside_systemd) {
    ::unsetenv("INVOCATION_ID");
    ::unsetenv("NOTIFY_SOCKET");
  }
  for (const auto& [k, v] : o.env) ::setenv(k.c_str(), v.c_str(), 1);
  for (const auto& k : o.unset_env) ::unsetenv(k.c_str());
  if (o.prepare && !o.prepare()) ::_exit(125);
  if (!o.log.empty()) {
    int fd = ::open(o.log.c_str(),
                    O_WRONLY | O_CREAT | O_CLOEXEC | (o.truncate_log ? O_TRUNC : O_APPEND), 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
  }
  ::execv(args[0], args.data());
  ::_exit(127);
}

// Signals the child and reaps it; `pid` is -1 after. Its wait status, or -1.
inline int stop_process(pid_t& pid, int sig = SIGTERM) {
  if (pid <= 0) return -1;
  ::kill(pid, sig);
  if (sig != SIGKILL) ::kill(pid, SIGCONT);  // a stopped process (SIGSTOP) gets it too
  int status = -1;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  pid = -1;
  return status;
}

}  // namespace weft::testing
