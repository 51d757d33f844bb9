// What the benchmarks that start tasks share: latency statistics, a timed exec, a
// weft-agent of their own, and removing a cgroup tree they made.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/fs.h"
#include "common/rpc/client.h"

namespace weft::bench {

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, max = 0;
  size_t n = 0;
};

inline Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  auto pct = [&](double p) {
    return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
  };
  s.p50 = pct(0.50);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

inline void row(const char* what, const Stats& s) {
  std::printf("  %-50s n=%-4zu p50=%7.2f ms  p90=%7.2f ms  p99=%7.2f ms  max=%7.2f ms\n", what, s.n,
              s.p50, s.p90, s.p99, s.max);
}

inline double ms_since(uint64_t t0) {
  return static_cast<double>(now_monotonic_us() - t0) / 1000.0;
}

// Runs argv, waits, returns wall ms (or -1 on failure; with any_exit, whatever its
// exit status). posix_spawnp, not fork: the child shares the benchmark's memory until
// its exec (CLONE_VM | CLONE_VFORK), so the benchmark's own size and threads (100 at
// once) cost nothing per command, and what is timed is the command itself, the same
// for every side.
inline double timed_exec(const std::vector<std::string>& argv, bool quiet = true,
                         bool any_exit = false) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (any_exit) posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  uint64_t t0 = now_monotonic_us();
  pid_t p = -1;
  int rc = posix_spawnp(&p, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(p, &status, 0) < 0 && errno == EINTR) {
  }
  double ms = ms_since(t0);
  return WIFEXITED(status) && (any_exit || WEXITSTATUS(status) == 0) ? ms : -1;
}

inline void remove_cgroup_tree(const std::string& dir) {
  if (!path_exists(dir)) return;
  if (auto e = list_dir(dir); e.ok())
    for (const auto& n : *e) {
      struct stat st;
      std::string p = dir + "/" + n;
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove_cgroup_tree(p);
    }
  (void)write_file(dir + "/cgroup.kill", "1");
  for (int i = 0; i < 2000 && rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) usleep(1000);
}

// Starts `agent_bin` with `dir`/agent.toml (the caller writes it), its output in
// `dir`/agent.log, and waits up to 5 s for it to answer on `sock`. Its pid, or -1.
inline pid_t start_agent_process(const char* agent_bin, const std::string& dir,
                                 const std::string& sock) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open((dir + "/agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(agent_bin, "weft-agent", "-c", (dir + "/agent.toml").c_str(), nullptr);
    _exit(127);
  }
  if (pid < 0) return -1;
  for (int i = 0; i < 500; ++i) {
    auto c = rpc::Client::connect(sock);
    if (c.ok() && (*c)->call("agent.info", nlohmann::json::object()).ok()) return pid;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// SIGKILLs and reaps `pid` (if any), and sets it to -1.
inline void kill_process(pid_t& pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

}  // namespace weft::bench
