// Control plane failover on etcd: two weft-controlplane replicas on one etcd (Debian's
// etcd-server, started here), simulated machines on the leader. Each round a machine
// holding a task goes silent and the leader is SIGKILLed at the same moment; timed from
// the kill: the follower leading and serving (controlplane.status says so), and the
// first replacement command (task.run for the silent machine's task) arriving at another
// machine. The second includes the dead-machine timeout (heartbeat 200 ms x 5 missed).
// The killed replica is started again as a follower and the roles swap.
//
//   build/bench/cp_failover --rounds 20
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/strings.h"
#include "testing/replica_harness.h"

using namespace weft;
using weft::testing::Machine;
using weft::testing::Replica;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"control plane failover on etcd"};
  int rounds = 20;
  int64_t ttl = 2;  // the shipped lease_ttl (controlplane/daemon/cp_conf.h)
  app.add_option("--rounds", rounds, "leader kills");
  app.add_option("--lease-ttl", ttl, "the leader's lease, seconds");
  std::string grace = "0s";
  app.add_option("--failover-grace", grace,
                 "the new leader's failover_grace (its default, 60s, gives the machines a "
                 "minute to come back before any is counted dead; 0s measures the mechanism)");
  CLI11_PARSE(app, argc, argv);
  std::string top = "failover_grace = \"" + grace + "\"\n";
  std::string dir = std::filesystem::temp_directory_path() / ("weft-failover-" + random_hex(5));
  (void)mkdir_p(dir);
  auto etcd = std::make_unique<weft::testing::EtcdServer>();
  if (!etcd->error().empty()) {
    std::fprintf(stderr, "cp_failover: %s\n", etcd->error().c_str());
    return 1;
  }
  std::string lease = std::to_string(ttl) + "s";
  std::unique_ptr<Replica> r[2] = {
      std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir, "a", etcd->client_config(), lease, top),
      std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir, "b", etcd->client_config(), lease,
                                top)};
  auto wait = [](auto pred, double s) {
    auto end = Clock::now() + std::chrono::duration<double>(s);
    while (Clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  r[0]->start();
  if (!wait([&] { return r[0]->leading(); }, 15)) {
    std::fprintf(stderr, "cp_failover: no leader\n%s", r[0]->log().c_str());
    return 1;
  }
  r[1]->start();
  std::vector<std::string> socks = {r[0]->sock(), r[1]->sock()};
  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 4; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ms.back()->connect(socks);
  }
  int lead = 0;
  (void)r[lead]->call("entitlement.create", {{"name", "web"}, {"quota", 4}});
  (void)r[lead]->call("job.create", {{"name", "svc"},
                                     {"entitlement", "web"},
                                     {"count", 3},
                                     {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
                                     {"task", {{"argv", {"/bin/sleep", "infinity"}}}}});
  auto steady = [&] {
    int running = 0;
    for (auto& m : ms) {
      if (!m->connected()) m->connect(socks);
      m->report();
      running += static_cast<int>(m->running().size());
    }
    return running == 3;
  };
  std::vector<double> lead_ms, cmd_ms;
  std::printf("cp_failover: 2 replicas, 1 etcd member, lease TTL %lld s, %d rounds\n",
              static_cast<long long>(ttl), rounds);
  for (int round = 0; round < rounds; ++round) {
    if (!wait(steady, 30)) {
      std::fprintf(stderr, "cp_failover: round %d: the job did not settle\n", round);
      break;
    }
    int follower = 1 - lead;
    if (!wait([&] { return r[follower]->call("controlplane.status").ok(); }, 10)) break;
    size_t victim = 0;
    while (ms[victim]->running().empty()) ++victim;
    int starts_before = 0;
    for (size_t i = 0; i < ms.size(); ++i)
      if (i != victim) starts_before += ms[i]->starts();
    ms[victim]->disconnect();
    auto t0 = Clock::now();
    r[lead]->stop(SIGKILL);
    double t_lead = -1, t_cmd = -1;
    auto end = t0 + std::chrono::seconds(30);
    while (Clock::now() < end && (t_lead < 0 || t_cmd < 0)) {
      if (t_lead < 0 && r[follower]->leading())
        t_lead = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      int starts = 0;
      for (size_t i = 0; i < ms.size(); ++i) {
        if (i == victim) continue;
        if (!ms[i]->connected()) ms[i]->connect(socks);
        ms[i]->report();
        starts += ms[i]->starts();
      }
      if (t_cmd < 0 && starts > starts_before)
        t_cmd = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::printf("round %2d: leader serving after %7.1f ms, first replacement command %7.1f ms\n",
                round, t_lead, t_cmd);
    std::fflush(stdout);
    if (t_lead >= 0) lead_ms.push_back(t_lead);
    if (t_cmd >= 0) cmd_ms.push_back(t_cmd);
    ms[victim]->connect(socks);  // back: its stale copy is stopped
    r[lead]->start();            // a follower now
    lead = follower;
  }
  std::printf(
      "failover (SIGKILL -> new leader serving): p50 %.0f ms, p99 %.0f ms, max %.0f ms (%zu)\n",
      pct(lead_ms, 0.5), pct(lead_ms, 0.99), pct(lead_ms, 1), lead_ms.size());
  std::printf(
      "failover (SIGKILL -> first replacement command): p50 %.0f ms, p99 %.0f ms, max %.0f ms "
      "(%zu)\n",
      pct(cmd_ms, 0.5), pct(cmd_ms, 0.99), pct(cmd_ms, 1), cmd_ms.size());
  r[0].reset();
  r[1].reset();
  etcd.reset();
  (void)remove_tree(dir);
  return lead_ms.size() == static_cast<size_t>(rounds) ? 0 : 1;
}
