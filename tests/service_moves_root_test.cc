// Issue 33, "zero failed requests through a move": an HTTP job of 6 tasks on a real
// cluster of four machines (network namespaces, real agents answering DNS), and a load
// generator on one machine that resolves the service through its agent's DNS for every
// new connection (caching answers for their TTL), keeps connections alive and retries a
// request once on a new connection when a kept-alive one was closed (bench/service_load.cc).
// A rolling update, a drain and a maintenance window with notice each complete with no
// failed request (refused, reset, timed out or 5xx); the same rolling update with
// discovery_withdraw = false has failures, so the test can tell. Each operation's
// figures are printed (docs/benchmarks.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "tests/agent_harness.h"
#include "tests/cluster_harness.h"

namespace weft::testing {
namespace {

constexpr int kClient = 3;  // the machine the load generator runs on

class ServiceMoves : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(c_.start_all());
  }

  json job(const std::string& version) {
    return {{"name", "web"},
            {"entitlement", "e"},
            {"count", 6},
            {"max_unavailable", 1},
            {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
            {"ports", {{"http", 0}}},
            {"discovery_drain", "2s"},
            {"task",
             {{"argv", {SERVICE_LOAD_BIN, "serve"}},
              {"env", {{"VERSION", version}}},
              {"namespaces", {{"network", "host"}}},
              {"stop_grace", "5s"},
              {"readiness",
               {{"type", "http"}, {"port", "http"}, {"path", "/"}, {"interval", "200ms"}}}}}};
  }

  // The job's tasks all ready at `generation`, and only those running; every agent that
  // answers DNS acknowledged what it was sent (the agent whose DNS clients asked for web
  // holds its latest endpoints).
  bool settled(uint64_t generation) {
    json r = c_.wait_cp(
        "job.show", {{"name", "web"}},
        [&](const json& j) {
          int ready = 0, other = 0;
          for (const auto& t : j["tasks"]) {
            bool live = t["state"] == "running" || t["state"] == "draining" ||
                        t["state"] == "stopping" || t["state"] == "starting";
            if (t["generation"] == generation && t["state"] == "running" && t["ready"] == true)
              ++ready;
            else if (live)
              ++other;
          }
          return ready == 6 && other == 0;
        },
        120000);
    if (r.is_null()) return false;
    json s = c_.wait_cp(
        "service.ls", json::object(),
        [](const json& j) {
          if (j["stops_waiting"] != 0) return false;
          for (const auto& a : j["agents"])
            if (a["behind"] != false) return false;
          for (const auto& svc : j["services"])
            if (svc["job"] == "web") return svc["endpoints"] == 6;
          return false;
        },
        30000);
    return !s.is_null();
  }

  // Runs the load generator while `operation` runs (and a second before and after);
  // its totals.
  json under_load(const std::string& what, const std::function<void()>& operation) {
    std::string out = c_.dir() + "/load-" + what + ".json";
    pid_t load = c_.start_in(kClient,
                             {SERVICE_LOAD_BIN, "load", "--name", "_http._tcp.web.e.weft.", "--dns",
                              "127.0.0.1:8600", "--workers", "8", "--per-connection", "20"},
                             out);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto t0 = std::chrono::steady_clock::now();
    operation();
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ClusterHarness::stop_in(load);
    std::string text = read_file(out).value_or("");
    size_t at = text.rfind("{\"seconds\"");
    json totals = at == std::string::npos ? json() : json::parse(text.substr(at), nullptr, false);
    EXPECT_TRUE(totals.is_object()) << text;
    if (!totals.is_object()) return json::object();
    std::printf(
        "%-28s %5.1f s | %7s requests %5s failed (refused %s, reset %s, timeout %s, "
        "5xx %s) | stale keep-alive retries %s | p50 %.2f ms p99 %.2f ms max %.2f ms\n",
        what.c_str(), took, totals["requests"].dump().c_str(), totals["failed"].dump().c_str(),
        totals["refused"].dump().c_str(), totals["reset"].dump().c_str(),
        totals["timeout"].dump().c_str(), totals["server_error"].dump().c_str(),
        totals["stale_retries"].dump().c_str(), totals["p50_ms"].get<double>(),
        totals["p99_ms"].get<double>(), totals["max_ms"].get<double>());
    std::fflush(stdout);
    return totals;
  }

  int busiest_machine() {
    std::map<std::string, int> n;
    json shown = c_.cp("job.show", {{"name", "web"}}).value_or(json::object());
    for (const auto& t : shown.value("tasks", json::array()))
      if (t["state"] == "running") ++n[t["machine"].get<std::string>()];
    std::string best;
    for (const auto& [m, k] : n)
      if (c_.machine_index(m) != kClient && (best.empty() || k > n[best])) best = m;
    return c_.machine_index(best);
  }

  bool machine_runs_none(const std::string& machine) {
    json r = c_.wait_cp(
        "job.show", {{"name", "web"}},
        [&](const json& j) {
          for (const auto& t : j["tasks"])
            if (t["machine"] == machine &&
                (t["state"] == "running" || t["state"] == "draining" || t["state"] == "stopping"))
              return false;
          return true;
        },
        120000);
    return !r.is_null();
  }

  ClusterHarness c_{ClusterOptions{}};
};

TEST_F(ServiceMoves, NoRequestFailsThroughAnUpdateADrainAndMaintenance) {
  // The host's network, as a grant (this test is about discovery, not the bridge).
  ASSERT_TRUE(c_.cp("entitlement.create",
                    {{"name", "e"}, {"quota", 4}, {"grants", {{"host_network", true}}}})
                  .ok());
  auto created = c_.cp("job.create", job("1"));
  ASSERT_TRUE(created.ok()) << created.error().str();
  ASSERT_TRUE(settled(1)) << c_.cp("job.show", {{"name", "web"}})->dump(2) << c_.logs();

  json update = under_load("rolling update", [&] {
    ASSERT_TRUE(c_.cp("job.update", job("2")).ok());
    ASSERT_TRUE(settled(2)) << c_.cp("job.show", {{"name", "web"}})->dump(2);
  });
  EXPECT_GT(update.value("requests", 0), 100);
  EXPECT_EQ(update.value("failed", -1), 0) << update.dump();

  int drained = busiest_machine();
  ASSERT_GE(drained, 0) << c_.cp("job.show", {{"name", "web"}})->dump(2);
  std::string name = c_.machine_id(drained);
  json drain = under_load("drain", [&] {
    ASSERT_TRUE(c_.cp("machine.drain", {{"machine", name}}).ok());
    ASSERT_TRUE(machine_runs_none(name));
    ASSERT_TRUE(settled(2));
  });
  EXPECT_GT(drain.value("requests", 0), 100);
  EXPECT_EQ(drain.value("failed", -1), 0) << drain.dump();
  ASSERT_TRUE(c_.cp("machine.drain", {{"machine", name}, {"drained", false}}).ok());

  int down = busiest_machine();
  ASSERT_GE(down, 0);
  std::string target = c_.machine_id(down);
  json maintenance = under_load("maintenance with notice", [&] {
    auto ev = c_.cp("maintenance.schedule", {{"machine", target},
                                             {"start", "+6s"},
                                             {"duration", "5s"},
                                             {"notice", "5s"},
                                             {"reason", "service moves test"}});
    ASSERT_TRUE(ev.ok()) << ev.error().str();
    ASSERT_TRUE(machine_runs_none(target));
    json done = c_.wait_cp(
        "maintenance.ls", {{"all", true}},
        [](const json& j) {
          for (const auto& e : j["events"])
            if (e["state"] != "done") return false;
          return true;
        },
        60000);
    ASSERT_FALSE(done.is_null()) << c_.cp("maintenance.ls", {{"all", true}})->dump(2);
    ASSERT_TRUE(settled(2));
  });
  EXPECT_GT(maintenance.value("requests", 0), 100);
  EXPECT_EQ(maintenance.value("failed", -1), 0) << maintenance.dump();

  // The same rolling update with stops sent at once: clients are sent to tasks that
  // are gone.
  c_.set_cp_extra("discovery_withdraw = false\n");
  c_.kill_cp(SIGTERM);
  c_.start_cp();
  ASSERT_TRUE(c_.wait_all_ready()) << c_.logs();
  ASSERT_TRUE(settled(2));
  json racing = under_load("update, no withdrawal", [&] {
    ASSERT_TRUE(c_.cp("job.update", job("3")).ok());
    ASSERT_TRUE(settled(3));
  });
  EXPECT_GT(racing.value("failed", 0), 0) << racing.dump();
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "web"}}).ok());
}

}  // namespace
}  // namespace weft::testing
