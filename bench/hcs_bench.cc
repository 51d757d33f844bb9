// weft-hcs benchmark: steady-state cost, carrier-loss detection time, and an OOM storm.
//
//   sudo build/bench/hcs_bench [--steady-seconds S] [--carrier-reps N]
//                              [--storm-rate KILLS_PER_MIN] [--storm-seconds S]
//
// Prints, for one run on this machine:
//  - steady state with the default configuration (5 s interval, kernel log, eBPF probes,
//    PSI triggers): CPU as a percentage of one core over S seconds, and RSS;
//  - carrier loss: a veth pair in a private network namespace, the peer set down, time
//    until the link probe is FAILED (fail_after = 3, so three samples), N repetitions;
//  - OOM storm: children in a memory cgroup with a 16 MiB limit, each touching 64 MiB,
//    started at the given rate for S seconds: kills achieved a minute, time until the
//    oom probe reports the storm, kills weft-hcs counted against kills that happened, and
//    weft-hcs's CPU during the storm.
// Needs root. Cleans up the cgroup, namespaces, processes and files it makes.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"

using json = nlohmann::json;
using namespace weft;

namespace {

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// CPU time (µs) of a process, from /proc/<pid>/stat utime + stime.
uint64_t cpu_us(pid_t pid) {
  auto s = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!s.ok()) return 0;
  auto rp = s->rfind(')');
  auto f = split(s->substr(rp + 2), ' ');
  if (f.size() < 13) return 0;
  uint64_t ticks = std::stoull(f[11]) + std::stoull(f[12]);
  return ticks * 1'000'000 / static_cast<uint64_t>(sysconf(_SC_CLK_TCK));
}

double rss_mib(pid_t pid) {
  auto s = read_file("/proc/" + std::to_string(pid) + "/status");
  if (!s.ok()) return 0;
  for (const auto& l : split(*s, '\n'))
    if (l.rfind("VmRSS:", 0) == 0) return std::strtod(l.c_str() + 6, nullptr) / 1024.0;
  return 0;
}

class Hcs {
 public:
  explicit Hcs(std::string dir) : dir_(std::move(dir)) {}
  ~Hcs() { stop(); }
  bool start(const std::string& extra, bool netns = false, const std::string& setup = "") {
    std::string conf = "socket = \"" + dir_ + "/hcs.sock\"\nstate_dir = \"" + dir_ + "/state\"\n" +
                       extra + "\n[liveness]\nagent_socket = \"\"\nsidekick_socket = \"\"\n";
    if (!write_file(dir_ + "/hcs.toml", conf).ok()) return false;
    pid_ = fork();
    if (pid_ == 0) {
      if (netns && (unshare(CLONE_NEWNET | CLONE_NEWNS) != 0 ||
                    mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
                    mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0))
        _exit(126);
      if (!setup.empty() && std::system(setup.c_str()) != 0) _exit(125);
      int fd = open((dir_ + "/hcs.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(WEFT_HCS_BIN, "weft-hcs", "-c", (dir_ + "/hcs.toml").c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 3000; ++i) {
      auto r = call("health.verdict");
      if (r.ok() && (*r)["published"] == true) return true;
      sleep_ms(10);
    }
    std::fprintf(stderr, "weft-hcs did not start: %s\n",
                 read_file(dir_ + "/hcs.log").value_or("").c_str());
    return false;
  }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  Result<json> call(const std::string& m) {
    TRY_ASSIGN(auto c, rpc::Client::connect(dir_ + "/hcs.sock"));
    return c->call(m, json::object(), 5000);
  }
  json probe(const std::string& name) {
    auto r = call("health.probes");
    if (r.ok())
      for (const auto& p : (*r)["probes"])
        if (p["probe"] == name) return p;
    return json::object();
  }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

int in_netns(pid_t pid, const std::string& cmd) {
  return std::system(
      ("nsenter -t " + std::to_string(pid) + " -n " + cmd + " >/dev/null 2>&1").c_str());
}

// A memory cgroup for the storm: v1's memory hierarchy on a hybrid host, else cgroup2.
std::string make_memcg(std::string* limit_file) {
  std::string name = "weft-hcs-bench-" + random_hex(4);
  if (path_exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    *limit_file = "memory.limit_in_bytes";
    return "/sys/fs/cgroup/memory/" + name;
  }
  *limit_file = "memory.max";
  return "/sys/fs/cgroup/" + name;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-hcs benchmark"};
  int steady_s = 60, reps = 10, storm_rate = 5000, storm_s = 60;
  app.add_option("--steady-seconds", steady_s, "steady-state measurement");
  app.add_option("--carrier-reps", reps, "carrier-loss repetitions");
  app.add_option("--storm-rate", storm_rate, "OOM kills a minute to cause");
  app.add_option("--storm-seconds", storm_s, "storm duration");
  CLI11_PARSE(app, argc, argv);
  if (geteuid() != 0) {
    std::fprintf(stderr, "hcs_bench needs root\n");
    return 2;
  }
  std::string dir = std::filesystem::temp_directory_path() / ("weft-hcs-bench-" + random_hex(5));
  if (!mkdir_p(dir + "/a").ok() || !mkdir_p(dir + "/b").ok()) return 1;
  int rc = 0;
  {
    // ---- steady state, default configuration
    Hcs h(dir + "/a");
    if (!h.start("")) return 1;
    sleep_ms(2000);
    auto probes = h.call("health.probes");
    std::string sources;
    if (probes.ok())
      for (const auto& p : (*probes)["probes"])
        if (p.contains("metrics") && p["metrics"].contains("source"))
          sources +=
              p["probe"].get<std::string>() + "=" + p["metrics"]["source"].get<std::string>() + " ";
    uint64_t c0 = cpu_us(h.pid()), t0 = now_monotonic_us();
    sleep_ms(steady_s * 1000);
    uint64_t c1 = cpu_us(h.pid()), t1 = now_monotonic_us();
    double steady_pct = 100.0 * static_cast<double>(c1 - c0) / static_cast<double>(t1 - t0);
    std::printf(
        "steady state (default config, %zu probes, %d s): CPU %.3f%% of a core, RSS %.1f MiB\n",
        probes.ok() ? (*probes)["probes"].size() : 0, steady_s, steady_pct, rss_mib(h.pid()));
    std::printf("  probe sources: %s\n", sources.c_str());

    // ---- OOM storm against the same daemon
    std::string limit_file, cg = make_memcg(&limit_file);
    if (mkdir_p(cg).ok() && write_file(cg + "/" + limit_file, std::to_string(16 << 20)).ok()) {
      json before = h.probe("oom");
      uint64_t counted0 = before["metrics"].value("total_since_start", 0);
      uint64_t hc0 = cpu_us(h.pid());
      uint64_t start = now_monotonic_us(), end = start + static_cast<uint64_t>(storm_s) * 1'000'000;
      double interval_us = 60e6 / storm_rate;
      uint64_t next = start;
      int started = 0, killed = 0, running = 0;
      double detect_s = -1;
      uint64_t next_poll = start;
      while (now_monotonic_us() < end || running > 0) {
        uint64_t now = now_monotonic_us();
        while (now < end && now >= next && running < 64) {
          pid_t c = fork();
          if (c == 0) {
            if (!write_file(cg + "/cgroup.procs", "0").ok()) _exit(3);
            for (int i = 0; i < 64; ++i) {
              char* b = static_cast<char*>(malloc(1 << 20));
              if (!b) _exit(4);
              std::memset(b, 1, 1 << 20);
            }
            _exit(0);
          }
          if (c > 0) {
            ++started;
            ++running;
          }
          next += static_cast<uint64_t>(interval_us);
        }
        int st;
        pid_t w;
        while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
          --running;
          if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ++killed;
        }
        if (detect_s < 0 && now >= next_poll) {
          json p = h.probe("oom");
          if (p.value("state", "") == "degraded" &&
              p.value("detail", "").find("storm") != std::string::npos)
            detect_s = static_cast<double>(now_monotonic_us() - start) / 1e6;
          next_poll = now + 100'000;
        }
        sleep_ms(1);
      }
      double wall = static_cast<double>(now_monotonic_us() - start) / 1e6;
      sleep_ms(1500);
      uint64_t hc1 = cpu_us(h.pid());
      json after = h.probe("oom");
      uint64_t counted = after["metrics"].value("total_since_start", 0) - counted0;
      std::printf(
          "OOM storm (target %d/min for %d s): %d children, %d OOM-killed = %.0f kills/min; "
          "weft-hcs counted %llu (%s)\n",
          storm_rate, storm_s, started, killed, killed / wall * 60.0,
          static_cast<unsigned long long>(counted), after["metrics"].value("source", "?").c_str());
      std::printf(
          "  storm reported (oom probe DEGRADED \"OOM storm\") after %.2f s; weft-hcs CPU "
          "during the storm %.3f%% of a core; RSS after %.1f MiB\n",
          detect_s, 100.0 * static_cast<double>(hc1 - hc0) / (wall * 1e6 + 1.5e6),
          rss_mib(h.pid()));
      if (detect_s < 0) rc = 1;
    } else {
      std::printf("OOM storm: no memory cgroup to run it in\n");
      rc = 1;
    }
    for (int i = 0; i < 500 && ::rmdir(cg.c_str()) != 0 && errno == EBUSY; ++i) sleep_ms(10);
  }
  {
    // ---- carrier loss in a private network namespace
    Hcs h(dir + "/b");
    if (!h.start("kmsg = false\nlink = [\"hv0\"]\n[hysteresis]\nrecover_after = 1\n"
                 "hold_down = \"0s\"\nflap_limit = 1000\n",
                 true,
                 "ip link add hv0 type veth peer name hv1 && ip link set hv0 up && "
                 "ip link set hv1 up"))
      return 1;
    std::vector<double> to_failed, to_first;
    for (int r = 0; r < reps; ++r) {
      // Back up: OK, or DEGRADED once the link probe counts the reps as flaps.
      for (int i = 0; i < 1000 && h.probe("link:hv0").value("state", "failed") == "failed"; ++i)
        sleep_ms(10);
      sleep_ms(300);
      uint64_t t0 = now_monotonic_us();
      in_netns(h.pid(), "ip link set hv1 down");
      double first = -1;
      for (int i = 0; i < 2000; ++i) {
        json p = h.probe("link:hv0");
        double t = static_cast<double>(now_monotonic_us() - t0) / 1e6;
        if (first < 0 && p.value("last_sample", "") == "failed") first = t;
        if (p.value("state", "") == "failed") {
          to_failed.push_back(t);
          break;
        }
        sleep_ms(5);
      }
      if (first >= 0) to_first.push_back(first);
      in_netns(h.pid(), "ip link set hv1 up");
    }
    std::printf(
        "carrier loss (%d reps, interval 5 s, fail_after 3, confirm 1 s): first failed "
        "sample p50 %.3f s max %.3f s; FAILED p50 %.3f s max %.3f s\n",
        reps, pct(to_first, 50), pct(to_first, 100), pct(to_failed, 50), pct(to_failed, 100));
    if (static_cast<int>(to_failed.size()) != reps) rc = 1;
  }
  (void)remove_tree(dir);
  return rc;
}
