// weft-controlplane as a process with rollouts (docs/jobs.md "Rollouts"), fake machines
// that run what they are told: a revert after a bad update, a paused rollout that stays
// paused across a control-plane kill, a canary promoted and one aborted; weftctl's
// commands for each.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <thread>

#include "testing/cp_process.h"
#include "testing/fake_machine.h"

namespace weft::testing {
namespace {

using json = nlohmann::json;

class Rollout : public ControlPlane {
 protected:
  void SetUp() override {
    ControlPlane::SetUp();
    start();
    if (HasFatalFailure()) return;
    for (int i = 0; i < 4; ++i)
      ms_.push_back(
          std::make_unique<FakeMachine>("h" + std::to_string(i), "r" + std::to_string(i)));
    connect();
    // The machines report every 100 ms on their own as well: a weftctl run that takes a
    // while (under the sanitizers) must not make them look dead, whose tasks would then
    // be replaced with the new spec whatever a pause says.
    for (auto& m : ms_) m->keep_alive();
    ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  }
  void connect() {
    for (auto& m : ms_) ASSERT_TRUE(m->connect(sock()));
  }
  json job(const std::string& marker, int canary = 0) {
    json j{{"name", "web"},
           {"entitlement", "e"},
           {"count", 4},
           {"max_unavailable", 2},
           {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
           {"task", {{"argv", {"/bin/echo", marker}}}}};
    if (canary) j["canary"] = canary;
    return j;
  }
  // The machines report for `ms` milliseconds.
  void pump(int ms) {
    for (int i = 0; i < ms / 50; ++i) {
      for (auto& m : ms_) m->report();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Running tasks by the marker their spec echoes (what each machine was told to run).
  std::map<std::string, int> running_markers() {
    std::map<std::string, std::string> marker;  // task id -> its argv[1]
    for (auto& m : ms_)
      for (const auto& r : m->runs()) marker[r.value("name", "")] = r["argv"][1].get<std::string>();
    std::map<std::string, int> out;
    for (auto& m : ms_)
      for (const auto& id : m->running()) ++out[marker[id]];
    return out;
  }
  bool wait_markers(const std::map<std::string, int>& want, int ms = 8000) {
    for (int i = 0; i < ms / 100; ++i) {
      pump(100);
      if (running_markers() == want) return true;
    }
    return false;
  }
  std::vector<std::unique_ptr<FakeMachine>> ms_;
};

TEST_F(Rollout, ABadUpdateIsRevertedAndHistoryShowsWhoDidWhat) {
  ASSERT_TRUE(call("job.create", job("v1")).ok());
  ASSERT_TRUE(wait_markers({{"v1", 4}}));
  ASSERT_TRUE(call("job.update", job("bad")).ok());
  ASSERT_TRUE(wait_markers({{"bad", 4}}));
  auto [rc, out] = weftctl("job history web");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("1"), std::string::npos);
  EXPECT_NE(out.find("2 (current)"), std::string::npos) << out;
  EXPECT_NE(out.find("updated by"), std::string::npos) << out;
  auto [vrc, vout] = weftctl("job revert --detach web 1");
  ASSERT_EQ(vrc, 0) << vout;
  ASSERT_TRUE(wait_markers({{"v1", 4}})) << call("job.show", {{"name", "web"}})->dump(2);
  auto h = call("job.history", {{"name", "web"}});
  ASSERT_TRUE(h.ok());
  const json& revs = (*h)["revisions"];
  ASSERT_EQ(revs.size(), 3u);
  EXPECT_EQ(revs[2]["generation"], 3);
  EXPECT_EQ(revs[2]["spec"]["task"]["argv"][1], "v1");
  EXPECT_EQ(revs[2]["note"].get<std::string>().rfind("revert to generation 1 by ", 0), 0u);
  // A revision it does not keep, and bad input.
  EXPECT_EQ(call("job.revert", {{"name", "web"}, {"generation", 9}}).error().code, rpc::kNotFound);
  EXPECT_FALSE(call("job.revert", {{"name", "web"}, {"generation", "x"}}).ok());
  EXPECT_FALSE(call("job.rollout", {{"name", "web"}, {"action", "explode"}}).ok());
}

TEST_F(Rollout, APausedRolloutStaysPausedAcrossAControlPlaneKill) {
  ASSERT_TRUE(call("job.create", job("v1")).ok());
  ASSERT_TRUE(wait_markers({{"v1", 4}}));
  auto [rc, out] = weftctl("job rollout pause web");
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(call("job.update", job("v2")).ok());
  pump(1000);
  EXPECT_EQ(running_markers(), (std::map<std::string, int>{{"v1", 4}}));
  stop(SIGKILL);
  start();
  if (HasFatalFailure()) return;
  connect();
  pump(1500);
  EXPECT_EQ(running_markers(), (std::map<std::string, int>{{"v1", 4}}));
  auto h = call("job.history", {{"name", "web"}});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE((*h)["paused"]) << h->dump(2);
  auto [rrc, rout] = weftctl("job rollout resume --detach web");
  ASSERT_EQ(rrc, 0) << rout;
  EXPECT_TRUE(wait_markers({{"v2", 4}}));
}

TEST_F(Rollout, ACanaryIsPromotedAndTheNextOneAborted) {
  ASSERT_TRUE(call("job.create", job("v1", 1)).ok());
  ASSERT_TRUE(wait_markers({{"v1", 4}}));
  ASSERT_TRUE(call("job.update", job("v2", 1)).ok());
  ASSERT_TRUE(wait_markers({{"v1", 3}, {"v2", 1}}));
  pump(1000);  // it holds
  EXPECT_EQ(running_markers(), (std::map<std::string, int>{{"v1", 3}, {"v2", 1}}));
  auto [prc, pout] = weftctl("job promote --detach web");
  ASSERT_EQ(prc, 0) << pout;
  ASSERT_TRUE(wait_markers({{"v2", 4}}));
  // The next update's canary is bad: aborted, every task goes back to v2's spec.
  ASSERT_TRUE(call("job.update", job("v3", 1)).ok());
  ASSERT_TRUE(wait_markers({{"v2", 3}, {"v3", 1}}));
  auto [arc, aout] = weftctl("job rollout abort --detach web");
  ASSERT_EQ(arc, 0) << aout;
  ASSERT_TRUE(wait_markers({{"v2", 4}}));
  auto h = call("job.history", {{"name", "web"}});
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE((*h)["canary"]);
  EXPECT_NE(h->dump().find("rollout of generation 3 aborted by"), std::string::npos) << h->dump(2);
  auto events = call("job.events", {{"name", "web"}});
  ASSERT_TRUE(events.ok());
  EXPECT_NE(events->dump().find("\"promoted\""), std::string::npos);
}

}  // namespace
}  // namespace weft::testing
