// At most one copy when the network splits (issue 61, docs/jobs.md "At most one copy"):
// a real machine (its agent, sidekick and hcs in a network namespace) holding a task of an
// at-most-one job is cut off from the control plane by packet filters in its namespace.
// Its agent fences the task on its own before the lease ends, the control plane starts it
// elsewhere only after that, and the agents' own start and stop times (the host's
// monotonic clock, which every agent here shares) show the old copy gone before the new
// one began. Then the same with the answers alone lost and the agent restarted meanwhile:
// the restarted agent fences from what it kept.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <set>
#include <string>

#include "common/fs.h"
#include "tests/agent_harness.h"
#include "tests/cluster_harness.h"

namespace weft::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kCpAddr = "10.77.0.1";

class Partition : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(c_.start_all());
  }
  void TearDown() override {
    for (int i : cut_) (void)c_.run_in(i, "nft delete table inet weft_partition");
  }
  // Packets between machine i and the control plane dropped: `both` ways, or only what
  // the control plane sends (the machine's calls arrive, their answers never do).
  void cut(int i, bool both) {
    std::string rules =
        "table inet weft_partition {\n"
        "  chain input_drop {\n"
        "    type filter hook input priority 0;\n"
        "    ip saddr " +
        std::string(kCpAddr) + " drop\n  }\n";
    if (both)
      rules += "  chain output_drop {\n    type filter hook output priority 0;\n    ip daddr " +
               std::string(kCpAddr) + " drop\n  }\n";
    rules += "}\n";
    std::string file = c_.dir() + "/partition-" + std::to_string(i) + ".nft";
    ASSERT_TRUE(write_file(file, rules).ok());
    auto r = c_.run_in(i, "nft -f " + file);
    ASSERT_TRUE(r.ok()) << r.error().str();
    cut_.insert(i);
  }
  void heal(int i) {
    auto r = c_.run_in(i, "nft delete table inet weft_partition");
    ASSERT_TRUE(r.ok()) << r.error().str();
    cut_.erase(i);
  }
  // The running copy of index 0 of `job` (the control plane's view), or null.
  static json running0(const json& show) {
    for (const auto& t : show["tasks"])
      if (t["index"] == 0 && t["state"] == "running") return t;
    return nullptr;
  }
  // Waits for index 0 of `job` to run on a machine other than `not_on`.
  json wait_moved(const std::string& job, const std::string& not_on, int ms) {
    return c_.wait_cp(
        "job.show", {{"name", job}},
        [&](const json& j) {
          json t = running0(j);
          return !t.is_null() && t["machine"] != not_on;
        },
        ms);
  }
  // The agent's own record of a task (task.show on machine i's Unix socket, which no
  // packet filter touches).
  json agent_task(int i, const std::string& id) {
    auto r = c_.agent(i, "task.show", {{"id", id}});
    return r.ok() ? *r : json(nullptr);
  }
  // The old copy (on `old_machine`) ended before the new one (on `new_machine`) began, by
  // the agents' own clocks.
  void expect_no_overlap(int old_machine, const std::string& old_id, int new_machine,
                         const std::string& new_id) {
    json old_t = agent_task(old_machine, old_id), new_t = agent_task(new_machine, new_id);
    ASSERT_FALSE(old_t.is_null()) << "machine " << old_machine << " forgot " << old_id;
    ASSERT_FALSE(new_t.is_null()) << new_id;
    ASSERT_TRUE(old_t.contains("finished_monotonic_us")) << old_t.dump();
    ASSERT_TRUE(new_t.contains("started_monotonic_us")) << new_t.dump();
    uint64_t ended = old_t["finished_monotonic_us"], began = new_t["started_monotonic_us"];
    EXPECT_LT(ended, began) << "two copies of index 0 ran at once for " << (ended - began) / 1000
                            << " ms\n"
                            << old_t.dump() << "\n"
                            << new_t.dump();
    std::cout << "[ fencing ] " << old_id << " ended " << (began - ended) / 1000 << " ms before "
              << new_id << " began\n";
    EXPECT_EQ(old_t["state"], "stopped") << old_t.dump();
    EXPECT_NE(old_t["reason"].get<std::string>().find("fenced: "), std::string::npos)
        << old_t.dump();
  }

  ClusterHarness c_{[] {
    ClusterOptions o;
    o.machines = 3;
    return o;
  }()};
  std::set<int> cut_;
};

TEST_F(Partition, AnAtMostOneTaskCutOffIsFencedBeforeItStartsElsewhere) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "db"}, {"quota", 3}, {"profile", "dev"}}).ok());
  // It ignores SIGTERM: only the fence's cut grace (then SIGKILL) ends it.
  json job = {{"name", "db"},
              {"entitlement", "db"},
              {"count", 1},
              {"copies", "at_most_one"},
              {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
              {"task",
               {{"argv", {"/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"}},
                {"stop_grace", "30s"}}}};
  auto created = c_.cp("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  json show = c_.wait_cp("job.show", {{"name", "db"}},
                         [](const json& j) { return !running0(j).is_null(); });
  ASSERT_FALSE(show.is_null()) << c_.logs();
  json first = running0(show);
  int victim = c_.machine_index(first["machine"]);
  ASSERT_GE(victim, 0);

  // Both ways: the control plane hears nothing and the agent no answer.
  auto t0 = Clock::now();
  cut(victim, true);
  json moved = wait_moved("db", first["machine"], 30000);
  ASSERT_FALSE(moved.is_null()) << c_.cp("job.show", {{"name", "db"}})->dump(2) << c_.logs();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::cout << "[ fencing ] cut both ways at 0 s; index 0 running elsewhere at " << secs << " s\n";
  // The lease here is 4 s (4 heartbeats of 500 ms, at least 4 s) plus its margin, from
  // the last report heard (up to a heartbeat before the cut).
  EXPECT_GT(secs, 3.0);  // not at missed_heartbeats (1.5 s): the lease was waited for
  EXPECT_LT(secs, 10.0);
  json second = running0(moved);
  int next = c_.machine_index(second["machine"]);
  expect_no_overlap(victim, first["id"], next, second["id"]);

  // Healed: the machine is back and never starts the fenced copy again.
  heal(victim);
  ASSERT_FALSE(c_.wait_cp("machine.show", {{"machine", c_.machine_id(victim)}}, [](const json& j) {
                   return j["connected"] == true && j["state"] != "dead";
                 }).is_null());
  // Its report of the fenced copy was heard (the control plane lets it forget it, or it
  // still lists it stopped); one copy of index 0 runs.
  ASSERT_FALSE(c_.wait_cp("job.show", {{"name", "db"}}, [&](const json& j) {
                   int live = 0;
                   for (const auto& t : j["tasks"])
                     live += t["state"] == "running" || t["state"] == "starting";
                   json old_t = agent_task(victim, first["id"]);
                   return live == 1 && (old_t.is_null() || old_t["state"] == "stopped");
                 }).is_null());

  // The answers alone lost (the control plane still hears the machine), and the agent
  // restarted meanwhile: the new agent fences from the lease it kept.
  int holder = next;
  t0 = Clock::now();
  cut(holder, false);
  c_.stop_machine(holder);  // SIGTERM to its daemons: the task runs on
  c_.start_machine(holder);
  json again = wait_moved("db", second["machine"], 30000);
  ASSERT_FALSE(again.is_null()) << c_.cp("job.show", {{"name", "db"}})->dump(2) << c_.logs();
  secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::cout << "[ fencing ] answers lost and agent restarted at 0 s; index 0 elsewhere at " << secs
            << " s\n";
  EXPECT_LT(secs, 10.0);
  json third = running0(again);
  expect_no_overlap(holder, second["id"], c_.machine_index(third["machine"]), third["id"]);
  heal(holder);
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "db"}}).ok());
}

// The other jobs keep today's behaviour: a machine cut off keeps running their tasks,
// the control plane starts them elsewhere after missed_heartbeats, and the old copy is
// stopped when the machine comes back.
TEST_F(Partition, AnyOtherJobsTaskRunsOnUntilItsMachineIsBack) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "web"}, {"quota", 3}, {"profile", "dev"}}).ok());
  json job = {{"name", "web"},
              {"entitlement", "web"},
              {"count", 1},
              {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
              {"task", {{"argv", {"/bin/sleep", "600"}}}}};
  ASSERT_TRUE(c_.cp("job.create", job).ok());
  json show = c_.wait_cp("job.show", {{"name", "web"}},
                         [](const json& j) { return !running0(j).is_null(); });
  ASSERT_FALSE(show.is_null()) << c_.logs();
  json first = running0(show);
  int victim = c_.machine_index(first["machine"]);
  cut(victim, true);
  json moved = wait_moved("web", first["machine"], 30000);
  ASSERT_FALSE(moved.is_null()) << c_.logs();
  // Not fenced: the old copy still runs on the machine that is cut off.
  json old_t = agent_task(victim, first["id"]);
  ASSERT_FALSE(old_t.is_null());
  EXPECT_EQ(old_t["state"], "running") << old_t.dump();
  heal(victim);
  // Back: it is told to stop the copy that was replaced.
  EXPECT_FALSE(c_.wait_cp("job.show", {{"name", "web"}}, [&](const json&) {
                   json t = agent_task(victim, first["id"]);
                   return t.is_null() || t["state"] == "stopped";
                 }).is_null());
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "web"}}).ok());
}

}  // namespace
}  // namespace weft::testing
