// A step of the wall clock (issue 61): the control plane and the agents run under
// libfaketime with their wall clocks offset by the test (their monotonic clocks are the
// host's). Stepped forward two hours and back, the daemons say so in their logs, and
// nothing that counts on time misbehaves: an at-most-one task is not fenced (the lease
// is monotonic), no machine is counted dead, a periodic job runs no period twice and
// does not run every period the step jumped over.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

#include "common/clock.h"
#include "common/fs.h"
#include "tests/agent_harness.h"
#include "tests/cluster_harness.h"

namespace weft::testing {
namespace {

// Two hours, or more than this machine has been up: libfaketime moves an absolute
// monotonic timer by the wall clock's offset unless the harness's shim keeps it true
// (tests/helpers/monotonic_timers.c), and a step larger than the uptime is the one that
// made a daemon's event loop end (EINVAL) on a freshly booted CI machine.
int64_t step_seconds() {
  double up = 0;
  if (auto u = read_file("/proc/uptime"); u.ok()) up = std::atof(u->c_str());
  return std::max<int64_t>(7200, static_cast<int64_t>(up) + 3600);
}

class ClockStep : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(c_.start_all());
  }
  // Every run of `tick` seen so far, by its period (its name's "-<unix time>").
  void read_runs() {
    auto r = c_.cp("job.show", {{"name", "tick"}});
    if (!r.ok() || !r->contains("periodic")) return;
    for (const auto& run : (*r)["periodic"]["runs"]) {
      std::string name = run["job"];
      periods_.insert(std::atoll(name.c_str() + name.rfind('-') + 1));
    }
  }
  // Reads the runs until one with a period after `after` appears: that period.
  int64_t wait_run_after(int64_t after, int ms = 60000) {
    for (int waited = 0; waited < ms; waited += 50) {
      read_runs();
      auto it = periods_.upper_bound(after);
      if (it != periods_.end()) return *it;
      sleep_ms(50);
    }
    return 0;
  }
  bool log_says(const std::string& file, const std::string& what, size_t times = 1) {
    for (int waited = 0; waited < 30000; waited += 50) {
      auto text = read_file(file);
      size_t n = 0;
      for (size_t at = text.ok() ? text->find(what) : std::string::npos; at != std::string::npos;
           at = text->find(what, at + 1))
        ++n;
      if (n >= times) return true;
      sleep_ms(50);
    }
    return false;
  }
  std::set<int64_t> periods_;
  ClusterHarness c_{[] {
    ClusterOptions o;
    o.machines = 2;
    o.faked_wall_clocks = true;
    return o;
  }()};
};

TEST_F(ClockStep, NoLeaseTimeoutOrScheduleMovesWithTheWallClock) {
  const int64_t step = step_seconds();
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 2}, {"profile", "dev"}}).ok());
  json db = {{"name", "db"},
             {"entitlement", "e"},
             {"count", 1},
             {"copies", "at_most_one"},
             {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
             {"task", {{"argv", {"/bin/sleep", "3600"}}}}};
  ASSERT_TRUE(c_.cp("job.create", db).ok());
  json tick = {{"name", "tick"},
               {"entitlement", "e"},
               {"kind", "batch"},
               {"batch", {{"completions", 1}}},
               {"periodic", {{"schedule", "*/5 * * * * *"}, {"overlap", "allow"}}},
               {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
               {"task", {{"argv", {"/bin/true"}}}}};
  ASSERT_TRUE(c_.cp("job.create", tick).ok());
  json running = c_.wait_cp("job.show", {{"name", "db"}}, [](const json& j) {
    for (const auto& t : j["tasks"])
      if (t["state"] == "running") return true;
    return false;
  });
  ASSERT_FALSE(running.is_null()) << c_.logs();
  std::string db_id, db_machine;
  for (const auto& t : running["tasks"])
    if (t["state"] == "running") db_id = t["id"], db_machine = t["machine"];
  const int holder = c_.machine_index(db_machine);
  ASSERT_GT(wait_run_after(0), 0) << c_.logs();  // the schedule runs

  // Forward two hours (or past the uptime), the control plane and the agent holding db.
  const int64_t before_step = static_cast<int64_t>(now_realtime_us() / 1'000'000);
  ASSERT_TRUE(c_.step_wall_clock(-1, step).ok());
  ASSERT_TRUE(c_.step_wall_clock(holder, step).ok());
  ASSERT_TRUE(log_says(c_.dir() + "/cp.log", "the wall clock stepped")) << c_.logs();
  ASSERT_TRUE(log_says(c_.agent_log(holder), "the wall clock stepped")) << c_.logs();
  // The next runs come from the stepped clock; of the ~1,440 periods jumped over, one
  // runs, and the job's events say why.
  int64_t first_after = wait_run_after(before_step + step - 10);
  ASSERT_GT(first_after, 0) << c_.logs();
  int64_t second_after = wait_run_after(first_after);  // five seconds of the new clock
  ASSERT_GT(second_after, 0) << c_.logs();
  int64_t third_after = wait_run_after(second_after);  // longer than fence_after
  ASSERT_GT(third_after, 0) << c_.logs();
  size_t jumped = 0;
  for (int64_t p : periods_) jumped += p > before_step + 5 && p < before_step + step - 10;
  EXPECT_LE(jumped, 1u) << "runs for periods the step jumped over: " << jumped;
  auto events = c_.cp("job.events", {{"name", "tick"}});
  ASSERT_TRUE(events.ok());
  EXPECT_NE(events->dump().find("the wall clock stepped forward by"), std::string::npos)
      << events->dump(2);

  // Back by a minute on the control plane, two hours on the agent: no period runs again,
  // and the schedule goes on after the last one that ran.
  ASSERT_TRUE(c_.step_wall_clock(-1, step - 20).ok());
  ASSERT_TRUE(c_.step_wall_clock(holder, 0).ok());
  ASSERT_TRUE(log_says(c_.dir() + "/cp.log", "the wall clock stepped", 2)) << c_.logs();
  ASSERT_TRUE(log_says(c_.agent_log(holder), "the wall clock stepped", 2)) << c_.logs();
  read_runs();  // (a run may have started between the last read and the step)
  const int64_t last_before_back = *periods_.rbegin();
  const size_t runs_before_back = periods_.size();
  const int64_t stepped_back_at = static_cast<int64_t>(now_monotonic_us() / 1'000'000);
  int64_t resumed = wait_run_after(last_before_back, 90000);
  ASSERT_GT(resumed, 0) << c_.logs();
  read_runs();
  for (int64_t p : periods_) EXPECT_TRUE(p <= last_before_back || p >= resumed) << p;
  EXPECT_EQ(periods_.size(), runs_before_back + 1);
  // It waited for the clock to pass the last period run (about the 20 s stepped back).
  EXPECT_GE(static_cast<int64_t>(now_monotonic_us() / 1'000'000) - stepped_back_at, 10);

  // Through it all: the same db task, never fenced, no machine counted dead.
  auto shown = c_.agent(holder, "task.show", {{"id", db_id}});
  ASSERT_TRUE(shown.ok()) << shown.error().str() << "\n" << c_.logs();
  EXPECT_EQ((*shown)["state"], "running") << shown->dump();
  EXPECT_TRUE(c_.log_lacks(-1, "tasks lost"));
  EXPECT_TRUE(c_.log_lacks(holder, "fencing"));
}

}  // namespace
}  // namespace weft::testing
