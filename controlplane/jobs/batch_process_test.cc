// weft-controlplane as a process with batch and periodic jobs (docs/jobs.md): a batch
// job created by weftctl from a job file runs to its end with fake machines whose tasks
// exit; a periodic job's runs start once a period, none twice and none skipped, across
// a SIGKILL of the control plane.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "common/fs.h"
#include "testing/cp_process.h"
#include "testing/fake_machine.h"

namespace weft::testing {
namespace {

using json = nlohmann::json;

// The runs a periodic job's machines were asked to start: run job -> the distinct task
// ids started for it.
std::map<std::string, std::set<std::string>> runs_started(
    const std::vector<std::unique_ptr<FakeMachine>>& ms, const std::string& job) {
  std::map<std::string, std::set<std::string>> out;
  for (const auto& m : ms)
    for (const auto& r : m->runs()) {
      std::string id = r.value("name", "");
      if (id.rfind(job + "-", 0) != 0) continue;
      out[id.substr(0, id.find('.'))].insert(id);
    }
  return out;
}

class Batch : public ControlPlane {
 protected:
  // Every task the machines run ends as `state` says; they report. Repeated for `ms`.
  void pump(int total_ms, const std::string& state = "exited") {  // "": none ends
    for (int i = 0; i < total_ms / 50; ++i) {
      for (auto& m : machines_) {
        if (!state.empty())
          for (const auto& t : m->running()) m->end_task(t, state);
        m->report();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void connect_all() {
    for (auto& m : machines_) ASSERT_TRUE(m->connect(sock()));
  }
  std::vector<std::unique_ptr<FakeMachine>> machines_;
};

TEST_F(Batch, AJobFileBatchJobRunsItsCompletionsAndEnds) {
  start();
  if (HasFatalFailure()) return;
  machines_ = fake_machines(2);
  connect_all();
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 2}}).ok());
  ASSERT_TRUE(write_file(dir_ + "/b.toml",
                         "name = \"crunch\"\nentitlement = \"e\"\nkind = \"batch\"\n"
                         "[batch]\ncompletions = 5\nparallelism = 2\nmax_failures = 1\n"
                         "[resources]\ncpu = 1\nmemory = \"64M\"\n"
                         "[task]\nargv = [\"/bin/true\"]\n")
                  .ok());
  auto [rc, out] = weftctl("job create --detach " + dir_ + "/b.toml");
  ASSERT_EQ(rc, 0) << out;
  // Nothing ends yet: two run at once.
  pump(300, "");
  size_t running = 0;
  for (auto& m : machines_) running += m->running().size();
  EXPECT_EQ(running, 2u);
  // The first to end fails (within max_failures 1); the rest exit 0.
  machines_[0]->end_task(*machines_[0]->running().begin(), "failed");
  machines_[0]->report();
  auto ended = [&] {
    auto r = call("job.show", {{"name", "crunch"}});
    return r.ok() && (*r)["batch"].value("outcome", "running") != "running";
  };
  for (int i = 0; i < 40 && !ended(); ++i) pump(250);
  auto shown = call("job.show", {{"name", "crunch"}});
  ASSERT_TRUE(shown.ok()) << shown.error().str();
  const json& b = (*shown)["batch"];
  EXPECT_EQ(b["outcome"], "succeeded") << shown->dump(2);
  EXPECT_EQ(b["succeeded"], 5);
  EXPECT_EQ(b["failed"], 1);
  int starts = 0;
  for (auto& m : machines_) starts += m->starts();
  EXPECT_EQ(starts, 6);  // five completions and the one retried
  // weftctl shows it, ended; stopping it removes it.
  auto [lrc, ls] = weftctl("job ls");
  EXPECT_EQ(lrc, 0) << ls;
  EXPECT_NE(ls.find("succeeded"), std::string::npos) << ls;
  auto [src, show] = weftctl("job show crunch");
  EXPECT_EQ(src, 0) << show;
  EXPECT_NE(show.find("5/5"), std::string::npos) << show;
  // The end and the failure are in its events.
  auto events = call("job.events", {{"name", "crunch"}});
  ASSERT_TRUE(events.ok());
  std::string text = events->dump();
  EXPECT_NE(text.find("\"succeeded\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"failed\""), std::string::npos) << text;
  // An ended job takes no scale; it goes when stopped.
  EXPECT_FALSE(call("job.scale", {{"name", "crunch"}, {"count", 2}}).ok());
  ASSERT_TRUE(call("job.stop", {{"name", "crunch"}}).ok());
  EXPECT_FALSE(call("job.show", {{"name", "crunch"}}).ok());
}

TEST_F(Batch, APeriodicJobRunsEachPeriodOnceAcrossAControlPlaneKill) {
  start();
  if (HasFatalFailure()) return;
  machines_ = fake_machines(2);
  connect_all();
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 2}}).ok());
  json job{{"name", "tick"},
           {"entitlement", "e"},
           {"kind", "batch"},
           {"batch", {{"completions", 1}}},
           {"periodic", {{"schedule", "*/2 * * * * *"}, {"overlap", "allow"}}},
           {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
           {"task", {{"argv", {"/bin/true"}}}}};
  ASSERT_TRUE(call("job.create", job).ok());
  auto shown = call("job.show", {{"name", "tick"}});
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ((*shown)["periodic"]["schedule"], "*/2 * * * * *");
  EXPECT_TRUE((*shown)["periodic"].contains("next_period")) << shown->dump(2);
  // Two periods run (waited for: a loaded machine is not held to a window).
  for (int i = 0; i < 80 && runs_started(machines_, "tick").size() < 2; ++i) pump(250);
  ASSERT_GE(runs_started(machines_, "tick").size(), 2u);
  // Killed for about two periods: they run when it is back (none skipped).
  stop(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  start();
  if (HasFatalFailure()) return;
  connect_all();
  // The periods missed while it was away, and the next ones: five runs in all.
  for (int i = 0; i < 80 && runs_started(machines_, "tick").size() < 5; ++i) pump(250);
  auto runs = runs_started(machines_, "tick");
  ASSERT_GE(runs.size(), 5u);
  std::vector<int64_t> periods;
  for (const auto& [run, ids] : runs) {
    EXPECT_EQ(ids.size(), 1u) << run << " started more than once";
    periods.push_back(std::stoll(run.substr(run.rfind('-') + 1)));
  }
  for (size_t i = 1; i < periods.size(); ++i)
    EXPECT_EQ(periods[i] - periods[i - 1], 2)
        << "a period was skipped or ran twice: " << periods[i];
  // The history kept: the three latest that succeeded (trimmed at the tick after a run
  // ends: the machines report on without ending what runs, past a tick).
  auto kept_runs = [&] {
    size_t kept = 0;
    shown = call("job.show", {{"name", "tick"}});
    if (shown.ok())
      for (const auto& r : (*shown)["periodic"]["runs"]) kept += r["outcome"] == "succeeded";
    return kept;
  };
  for (int i = 0; i < 80 && kept_runs() != 3; ++i) pump(250, "");
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(kept_runs(), 3u) << shown->dump(2);
  // Stopping it stops its runs; none starts after.
  ASSERT_TRUE(call("job.stop", {{"name", "tick"}}).ok());
  size_t before = runs_started(machines_, "tick").size();
  pump(2500);
  EXPECT_EQ(runs_started(machines_, "tick").size(), before);
}

}  // namespace
}  // namespace weft::testing
