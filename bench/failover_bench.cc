// Machine failure to replacement task running, end to end (issue 6): the multi-machine
// cluster of the root tests (control plane + machines in network namespaces, each with
// agent, sidekick and hcs over TCP). Each repetition kills the machine running task 0
// of a job (its daemons and tasks, as a power loss), times until the control plane
// marks it dead and until the replacement task is reported running on another machine
// (checked with that machine's agent), then brings the machine back.
//
// With --partition the machine is not killed but cut off from the control plane (a
// packet filter in its namespace, both ways), and healed after its task runs elsewhere;
// with --at-most-one the job is fenced by the machines' leases (issue 61): its old copy
// is stopped by its own agent, and the replacement waits for the lease. Then the
// agents' own times of the old copy's end and the new one's start are printed too
// (gap_ms: how long before the new start the old copy ended; negative would be two
// copies at once).
//
//   sudo build/bench/failover_bench [--reps 20] [--machines 5] [--heartbeat 500ms]
//                                   [--missed 3] [--partition] [--at-most-one]
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
  bool partition = false, at_most_one = false;
  app.add_option("--reps", reps, "machine failures to time");
  app.add_option("--machines", machines, "machines in the cluster (at least 3)");
  app.add_option("--heartbeat", heartbeat, "control plane heartbeat interval");
  app.add_option("--missed", missed, "missed heartbeats before a machine is dead");
  app.add_flag("--partition", partition, "cut the machine off instead of killing it");
  app.add_flag("--at-most-one", at_most_one, "the job's copies = \"at_most_one\"");
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
                                     {"copies", at_most_one ? "at_most_one" : "any"},
                                     {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
                                     {"task", {{"argv", {"/bin/sleep", "3600"}}}}});
  if (!created.ok()) {
    std::fprintf(stderr, "job.create: %s\n", created.error().str().c_str());
    return 1;
  }
  std::printf("cluster: %d machines, job of %d tasks (copies %s), heartbeat %s x %d missed, %s\n",
              o.machines, o.machines - 2, at_most_one ? "at_most_one" : "any", heartbeat.c_str(),
              missed, partition ? "machine cut off both ways" : "machine killed");
  std::printf("%4s %8s %10s %12s %8s\n", "rep", "machine", "dead_s", "running_s", "gap_ms");
  std::vector<double> dead_s, run_s, gap_ms;
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
    if (partition) {
      if (auto cut = c.cut_off(m, ClusterHarness::Cut::kBoth); !cut.ok()) {
        std::fprintf(stderr, "cut off: %s\n", cut.error().str().c_str());
        return 1;
      }
    } else {
      c.kill_machine(m);
    }
    json replacement;
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
          replacement = *a;
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
    double gap = 0;
    if (partition) {
      // The old copy as its own agent saw it (its Unix socket is not cut off).
      auto old_t = c.agent(m, "task.show", {{"id", victim["id"]}});
      if (old_t.ok() && old_t->contains("finished_monotonic_us") &&
          replacement.contains("started_monotonic_us"))
        gap = (replacement["started_monotonic_us"].get<double>() -
               (*old_t)["finished_monotonic_us"].get<double>()) /
              1000.0;
      else
        gap = at_most_one ? -1e9 : 0;  // an at-most-one copy that did not end is a failure
      gap_ms.push_back(gap);
    }
    std::printf("%4d %8s %10.3f %12.3f %8.0f\n", rep, mid.c_str(), dead, running, gap);
    std::fflush(stdout);
    if (partition) {
      (void)c.heal_link(m);
    } else {
      c.start_machine(m);
    }
    c.wait_cp("machine.show", {{"machine", mid}},
              [](const json& j) { return j["state"] == "ok" && j["sidekick_connected"] == true; });
  }
  std::printf("\nfailure -> marked dead:        p50 %.3f s  p99 %.3f s  max %.3f s\n",
              pct(dead_s, 50), pct(dead_s, 99), pct(dead_s, 99.99));
  std::printf("failure -> replacement running: p50 %.3f s  p99 %.3f s  max %.3f s  (%d reps)\n",
              pct(run_s, 50), pct(run_s, 99), pct(run_s, 100), reps);
  if (partition && at_most_one) {
    std::printf(
        "old copy ended -> new copy began (agents' clocks): min %.0f ms (negative: two "
        "copies ran at once)\n",
        pct(gap_ms, 0));
    if (pct(gap_ms, 0) < 0) return 1;
  }
  (void)c.cp("job.stop", {{"name", "bench"}});
  return 0;
}
