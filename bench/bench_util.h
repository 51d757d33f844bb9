// What the benchmarks that start tasks share: latency statistics, a timed exec, and
// removing a cgroup tree they made.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "common/fs.h"

namespace weft::bench {

struct Stats {
  double p50 = 0, p99 = 0, mean = 0, max = 0;
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
  s.p99 = pct(0.99);
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

inline void row(const char* what, const Stats& s) {
  std::printf("  %-58s n=%-5zu p50=%8.2f ms  p99=%8.2f ms  max=%8.2f ms\n", what, s.n, s.p50, s.p99,
              s.max);
}

inline double ms_since(uint64_t t0) {
  return static_cast<double>(now_monotonic_us() - t0) / 1000.0;
}

// Runs argv, waits, returns wall ms (or -1 on failure).
inline double timed_exec(const std::vector<std::string>& argv, bool quiet = true) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  uint64_t t0 = now_monotonic_us();
  pid_t p = fork();
  if (p == 0) {
    if (quiet) {
      int fd = open("/dev/null", O_WRONLY);
      dup2(fd, 1);
    }
    execvp(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  waitpid(p, &status, 0);
  double ms = ms_since(t0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ms : -1;
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

}  // namespace weft::bench
