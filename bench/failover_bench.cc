// Machine failure to replacement task running, end to end (issue 6): the multi-machine
// cluster of the root tests (control plane + machines in network namespaces, each with
// agent, sidekick and hcs over TCP). Each repetition kills the machine running task 0
// of a job (its daemons and tasks, as a power loss), times until the control plane
// marks it dead and until the replacement task is reported running on another machine
// (checked with that machine's agent), then brings the machine back.
//
//   sudo build/bench/failover_bench [--reps 20] [--machines 5] [--heartbeat 500ms]
//                                   [--missed 3]
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>

#include "tests/cluster_harness.h"

using namespace weft::testing;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

json task0(ClusterHarness& c) {
  auto r = c.cp("job.show", {{"name", "bench"}});
  if (!r.ok()) return json();
  for (const auto& t : (*r)["tasks"])
    if (t["index"] == 0 && t["state"] == "running") return t;
  return json();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"failover_bench: machine failure to replacement running"};
  int reps = 20, machines = 5, missed = 3;
  std::string heartbeat = "500ms";
  app.add_option("--reps", reps, "machine failures to time");
  app.add_option("--machines", machines, "machines in the cluster (at least 3)");
  app.add_option("--heartbeat", heartbeat, "control plane heartbeat interval");
  app.add_option("--missed", missed, "missed heartbeats before a machine is dead");
  CLI11_PARSE(app, argc, argv);
  if (geteuid() != 0) {
    std::fprintf(stderr, "failover_bench: needs root (network namespaces, cgroups)\n");
    return 2;
  }
  ::testing::InitGoogleTest();  // the harness reports problems as test failures
  ClusterOptions o;
  o.machines = std::max(3, machines);
  o.heartbeat = heartbeat;
  o.missed_heartbeats = missed;
  ClusterHarness c(o);
  if (!c.setup()) return 1;
  c.start_cp();
  for (int i = 0; i < o.machines; ++i) c.start_machine(i);
  if (!c.wait_all_ready()) {
    std::fprintf(stderr, "machines did not become ready:\n%s\n", c.logs().c_str());
    return 1;
  }
  (void)c.cp("entitlement.create", {{"name", "bench"}, {"quota", o.machines}, {"profile", "dev"}});
  auto created = c.cp("job.create", {{"name", "bench"},
                                     {"entitlement", "bench"},
                                     {"count", o.machines - 2},
                                     {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
                                     {"task", {{"argv", {"/bin/sleep", "3600"}}}}});
  if (!created.ok()) {
    std::fprintf(stderr, "job.create: %s\n", created.error().str().c_str());
    return 1;
  }
  std::printf("cluster: %d machines, job of %d tasks, heartbeat %s x %d missed\n", o.machines,
              o.machines - 2, heartbeat.c_str(), missed);
  std::printf("%4s %8s %10s %12s\n", "rep", "machine", "dead_s", "running_s");
  std::vector<double> dead_s, run_s;
  for (int rep = 0; rep < reps; ++rep) {
    json t = c.wait_cp("job.show", {{"name", "bench"}},
                       [&](const json&) { return !task0(c).is_null(); });
    json victim = task0(c);
    if (victim.is_null()) {
      std::fprintf(stderr, "task 0 is not running:\n%s\n", c.logs().c_str());
      return 1;
    }
    std::string mid = victim["machine"];
    int m = c.machine_index(mid);
    auto t0 = Clock::now();
    c.kill_machine(m);
    double dead = -1, running = -1;
    while (std::chrono::duration<double>(Clock::now() - t0).count() < 120) {
      if (dead < 0) {
        auto s = c.cp("machine.show", {{"machine", mid}});
        if (s.ok() && (*s)["state"] == "dead")
          dead = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      json now = task0(c);
      if (!now.is_null() && now["machine"] != mid) {
        double at = std::chrono::duration<double>(Clock::now() - t0).count();
        auto a = c.agent(c.machine_index(now["machine"]), "task.show", {{"id", now["id"]}});
        if (a.ok() && (*a)["state"] == "running") {
          running = at;
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (running < 0) {
      std::fprintf(stderr, "no replacement within 120 s:\n%s\n%s\n%s\n",
                   c.cp("job.show", {{"name", "bench"}})->dump(2).c_str(),
                   c.cp("machine.ls")->dump(2).c_str(), c.logs().c_str());
      return 1;
    }
    dead_s.push_back(dead);
    run_s.push_back(running);
    std::printf("%4d %8s %10.3f %12.3f\n", rep, mid.c_str(), dead, running);
    std::fflush(stdout);
    c.start_machine(m);
    c.wait_cp("machine.show", {{"machine", mid}},
              [](const json& j) { return j["state"] == "ok" && j["sidekick_connected"] == true; });
  }
  std::printf("\nfailure -> marked dead:        p50 %.3f s  p99 %.3f s  max %.3f s\n",
              pct(dead_s, 50), pct(dead_s, 99), pct(dead_s, 99.99));
  std::printf("failure -> replacement running: p50 %.3f s  p99 %.3f s  max %.3f s  (%d reps)\n",
              pct(run_s, 50), pct(run_s, 99), pct(run_s, 100), reps);
  (void)c.cp("job.stop", {{"name", "bench"}});
  return 0;
}
