// Autoscaling against the real control plane (docs/jobs.md, "Autoscaling"): fake
// machines answer task.usage from a load curve (the load split evenly over the job's
// running tasks), the control plane asks every second; the job follows the load in
// steps, within the tolerance of its target, never past the entitlement's quota,
// without changing direction within its scale-down window; a paused job is measured and
// not resized; every resize is in the audit log with its reason.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>
#include <tuple>

#include "common/clock.h"
#include "testing/cp_process.h"
#include "testing/fake_machine.h"

namespace weft::testing {
namespace {

TEST_F(ControlPlane, AJobFollowsItsLoadWithinItsBoundsAndQuota) {
  add_config("autoscale_interval = \"1s\"\n");
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0"), b("b", "r1");
  ASSERT_TRUE(a.connect(sock()));
  ASSERT_TRUE(b.connect(sock()));
  // One machine of 4 cores: at most 8 tasks of half a core.
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 1}}).ok());
  json job{{"name", "web"},
           {"entitlement", "e"},
           {"count", 2},
           {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
           {"autoscale", {{"min", 1}, {"max", 12}, {"target", 0.5}, {"scale_down_window", "3s"}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  auto created = call("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();

  // The load (cores) is split over the running tasks, as a balanced service's is; the
  // target is a quarter of a core a task (0.5 of 500m).
  double load = 1.0;
  std::vector<int> sizes;  // the job's count after each change
  auto count = [&]() -> int {
    auto r = call("job.show", {{"name", "web"}});
    return r.ok() ? (*r)["spec"]["count"].get<int>() : -1;
  };
  auto pump = [&] {
    size_t n = a.running().size() + b.running().size();
    uint64_t per = n ? static_cast<uint64_t>(load * 1000 / static_cast<double>(n)) : 0;
    a.set_cpu_milli(per);
    b.set_cpu_milli(per);
    a.report();
    b.report();
    int c = count();
    if (c > 0 && (sizes.empty() || sizes.back() != c)) sizes.push_back(c);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  // Steady at `want` for two rounds in a row.
  auto settles_at = [&](int want) {
    int steady = 0;
    for (int i = 0; i < 400 && steady < 40; ++i) {
      pump();
      steady = count() == want && a.running().size() + b.running().size() == size_t(want)
                   ? steady + 1
                   : 0;
    }
    return steady >= 40;
  };
  // 1 core / 0.25 = 4 tasks; then 2 cores: 8 (one step: 100% of 4 a period).
  ASSERT_TRUE(settles_at(4)) << "sizes " << json(sizes).dump();
  load = 2.0;
  ASSERT_TRUE(settles_at(8)) << "sizes " << json(sizes).dump();
  // 3 cores would be 12, but the quota's one machine holds 8: the job stays at 8 and the
  // refusal is in the audit log.
  load = 3.0;
  bool refused_seen = false;
  for (int i = 0; i < 400 && !refused_seen; ++i) {
    pump();
    auto r = call("job.autoscale", {{"name", "web"}});
    refused_seen = r.ok() && !(*r)["changes"].empty() && (*r)["changes"].back()["result"] != "ok";
  }
  EXPECT_TRUE(refused_seen);
  for (int i = 0; i < 20; ++i) pump();
  EXPECT_EQ(count(), 8);
  // Down to 0.75 cores: 3 tasks, once the scale-down window (3 s) saw nothing higher.
  load = 0.75;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(settles_at(3)) << "sizes " << json(sizes).dump();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // Within ±15% of the target after each step (settled at the exact sizes), and no
  // oscillation: the sizes went up (in steps the scale-up rate allows: 100% of the size
  // at the start of a 15 s period, at least 4), then down, one change of direction.
  int turns = 0;
  for (size_t i = 2; i < sizes.size(); ++i)
    turns += (sizes[i] > sizes[i - 1]) != (sizes[i - 1] > sizes[i - 2]);
  EXPECT_EQ(turns, 1) << json(sizes).dump();
  EXPECT_EQ(sizes.back(), 3);
  size_t changes_before_pause = sizes.size() - 1;

  // Paused: measured and decided for, not resized.
  auto paused = call("job.autoscale.pause", {{"name", "web"}, {"paused", true}});
  ASSERT_TRUE(paused.ok()) << paused.error().str();
  load = 1.5;  // 6 tasks' worth
  json shown;
  for (int i = 0; i < 100; ++i) {
    pump();
    auto r = call("job.autoscale", {{"name", "web"}});
    ASSERT_TRUE(r.ok()) << r.error().str();
    shown = *r;
    if (shown["decision"].is_object() && shown["decision"]["desired"] == 6) break;
  }
  EXPECT_EQ(shown["paused"], true) << shown.dump();
  EXPECT_EQ(shown["decision"]["desired"], 6) << shown.dump();
  EXPECT_EQ(count(), 3);
  EXPECT_NEAR(shown["measured"]["load"].get<double>(), 1.5, 0.05) << shown.dump();
  EXPECT_DOUBLE_EQ(shown["target_per_task"].get<double>(), 0.25);
  ASSERT_FALSE(shown["changes"].empty());
  EXPECT_EQ(shown["changes"].back()["to"], 3) << shown.dump();
  // Resumed: it acts on it.
  ASSERT_TRUE(call("job.autoscale.pause", {{"name", "web"}, {"paused", false}}).ok());
  EXPECT_TRUE(settles_at(6)) << "sizes " << json(sizes).dump();

  // The audit log has every change with its reason, the quota's refusal among them.
  auto audit = call("audit.ls", {{"limit", 200}});
  ASSERT_TRUE(audit.ok()) << audit.error().str();
  int resized = 0, refused = 0;
  for (const auto& e : (*audit)["entries"]) {
    if (e["role"] != "autoscaler") continue;
    EXPECT_EQ(e["target"], "web");
    std::string result = e["result"];
    EXPECT_NE(result.find("against a target of 0.25"), std::string::npos) << result;
    (result.rfind("ok: ", 0) == 0 ? resized : refused)++;
  }
  EXPECT_EQ(resized, static_cast<int>(changes_before_pause + 1)) << audit->dump();  // and 3->6
  EXPECT_EQ(refused, 1) << audit->dump();  // 8->12 does not fit: once, not every round
  // Bad input is refused, naming the field; nothing changes.
  auto bad = call("job.autoscale.pause", {{"name", "web"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("paused: ", 0), 0u) << bad.error().str();
  bad = call("job.autoscale.pause", {{"name", "web"}, {"paused", "yes"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("paused: ", 0), 0u) << bad.error().str();
  EXPECT_EQ(call("job.autoscale", {{"name", "nope"}}).error().code, rpc::kNotFound);
  EXPECT_EQ(count(), 6);

  auto [rc, out] = weftctl("job autoscale show web");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("count: 6 (min 1, max 12)"), std::string::npos) << out;
  EXPECT_NE(out.find("0.25 cores a task"), std::string::npos) << out;
  EXPECT_NE(out.find("3 -> 6"), std::string::npos) << out;
  std::tie(rc, out) = weftctl("job autoscale pause web");
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = weftctl("job show web");
  EXPECT_NE(out.find("autoscale: 1 to 12 tasks, cpu at 0.5 a task (paused)"), std::string::npos)
      << out;
  std::tie(rc, out) = weftctl("job autoscale resume nope");
  EXPECT_NE(rc, 0) << out;
}

// Autoscaling's memory survives the leader's SIGKILL (store/notes.h): a job grown for a
// load that then fell is held by its scale-down window on the next leader too (a fresh
// history would shrink it at its first round), and `job autoscale` shows the changes the
// last one made.
TEST_F(ControlPlane, AutoscalingGoesOnFromTheLastLeadersWindowsAndChanges) {
  add_config("autoscale_interval = \"1s\"\n");
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0");
  ASSERT_TRUE(a.connect(sock()));
  a.keep_alive();
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 1}}).ok());
  json job{{"name", "web"},
           {"entitlement", "e"},
           {"count", 1},
           {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
           {"autoscale", {{"min", 1}, {"max", 8}, {"target", 0.5}, {"scale_down_window", "1h"}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  ASSERT_TRUE(call("job.create", job).ok());
  auto count = [&]() -> int {
    auto r = call("job.show", {{"name", "web"}});
    return r.ok() ? (*r)["spec"]["count"].get<int>() : -1;
  };
  // 1 core of load over the running tasks: 4 tasks of a quarter core's target.
  auto load = [&](double cores) {
    size_t n = a.running().size();
    a.set_cpu_milli(n ? static_cast<uint64_t>(cores * 1000 / static_cast<double>(n)) : 0);
  };
  auto until = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 600 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return done();
  };
  ASSERT_TRUE(until([&] {
    load(1.0);
    return count() == 4 && a.running().size() == 4;
  })) << count();
  // The load falls to a quarter: the window (an hour) holds the job at 4.
  json shown;
  ASSERT_TRUE(until([&] {
    load(0.25);
    auto r = call("job.autoscale", {{"name", "web"}});
    if (!r.ok() || !(*r)["measured"].is_object()) return false;
    shown = *r;
    return (*r)["measured"]["load"].get<double>() < 0.3 && (*r)["decision"]["desired"] == 4;
  })) << shown.dump(2);
  ASSERT_FALSE(shown["changes"].empty()) << shown.dump(2);
  // An acknowledged write: what the rounds kept before it is durable with it.
  ASSERT_TRUE(call("rebalance.pause", {{"name", "e"}, {"paused", false}}).ok());
  stop(SIGKILL);
  start();
  if (HasFatalFailure()) return;
  a.disconnect();
  ASSERT_TRUE(a.connect(sock()));
  // The changes shown before, shown again at once.
  auto kept = call("job.autoscale", {{"name", "web"}});
  ASSERT_TRUE(kept.ok()) << kept.error().str();
  EXPECT_EQ((*kept)["changes"], shown["changes"]) << kept->dump(2);
  // A decision of this leader (measured after its start) still holds the job at 4.
  const uint64_t restarted = now_realtime_us();
  json decided;
  ASSERT_TRUE(until([&] {
    load(0.25);
    auto r = call("job.autoscale", {{"name", "web"}});
    if (!r.ok() || !(*r)["measured"].is_object() ||
        (*r)["measured"]["at_us"].get<uint64_t>() < restarted)
      return false;
    decided = *r;
    return true;
  })) << kept->dump(2);
  EXPECT_EQ(decided["decision"]["desired"], 4) << decided.dump(2);
  EXPECT_EQ(count(), 4);
}

// The ReBalancer's plan for an entitlement (rebalance.plan): lightly used machines of one
// fault domain are emptied onto the fullest (what the entitlement could give back); a job
// with rebalance = false is never moved; nothing moves (it is a plan).
TEST_F(ControlPlane, TheRebalancerPlansToFreeLightMachinesAndMovesNothing) {
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0"), b("b", "r0"), c("c", "r0");
  for (FakeMachine* m : {&a, &b, &c}) {
    ASSERT_TRUE(m->connect(sock()));
    m->keep_alive();  // alive however slowly the rest is set up (a sanitizer build)
  }
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 3}}).ok());
  auto job = [](const std::string& name, int count) {
    return json{{"name", name},
                {"entitlement", "e"},
                {"count", count},
                {"max_unavailable", count},
                {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
                {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  };
  ASSERT_TRUE(call("job.create", job("web", 3)).ok());
  json pinned = job("pinned", 1);
  pinned["rebalance"] = false;
  auto created = call("job.create", pinned);
  ASSERT_TRUE(created.ok()) << created.error().str();
  auto ready = [&] {
    auto r = call("job.ls");
    int n = 0;
    if (r.ok())
      for (const auto& j : (*r)["jobs"]) n += j["ready"].get<int>();
    return n;
  };
  for (int i = 0; i < 200 && ready() < 4; ++i) {
    for (FakeMachine* m : {&a, &b, &c}) m->report();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ready(), 4);
  for (const char* planner : {"local", "exact"}) {
    auto plan = call("rebalance.plan", {{"name", "e"}, {"planner", planner}});
    ASSERT_TRUE(plan.ok()) << plan.error().str();
    const json& p = *plan;
    EXPECT_EQ(p["machines"], 3) << p.dump();
    EXPECT_EQ(p["tasks"], 4) << p.dump();
    EXPECT_EQ(p["before"]["machines_used"], 3) << p.dump();
    EXPECT_EQ(p["after"]["machines_used"], 1) << planner << ": " << p.dump();
    EXPECT_EQ(p["moves"].size(), 2u) << p.dump();
    for (const auto& m : p["moves"]) {
      EXPECT_EQ(m["job"], "web") << m.dump();
      EXPECT_EQ(m["aim"], "free a whole machine") << m.dump();
    }
    if (std::string(planner) == "exact") {
      EXPECT_EQ(p["solver"], "optimal");
    }
  }
  // A plan moves nothing.
  int stops = a.stops() + b.stops() + c.stops();
  EXPECT_EQ(stops, 0);
  // Bad input names the field.
  auto bad = call("rebalance.plan", {{"name", "e"}, {"planner", "magic"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("planner: ", 0), 0u) << bad.error().str();
  bad = call("rebalance.plan", {{"name", "e"}, {"budget", 0}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("budget: ", 0), 0u) << bad.error().str();
  EXPECT_EQ(call("rebalance.plan", {{"name", "nope"}}).error().code, rpc::kNotFound);
  EXPECT_EQ(call("rebalance.plan", json::object()).error().message.rfind("name: ", 0), 0u);
  auto [rc, text] = weftctl("rebalance plan e");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("after:  spread violations 0, machines used 1, empty 2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("2 moves"), std::string::npos) << text;
}

// Two fault domains of two fake machines (a and b in r0, c and d in r1), the
// ReBalancer's loop every second, an entitlement "e" and a job "web" of two spread tasks
// with max_unavailable 1, placed one in each domain; and what job.show says of a job.
class RebalancerLoop : public ControlPlane {
 protected:
  void set_up(int quota) {
    enable_rebalancer();
    start();
    if (HasFatalFailure()) return;
    for (FakeMachine* m : {&a_, &b_, &c_, &d_}) {
      ASSERT_TRUE(m->connect(sock()));
      m->keep_alive();
    }
    ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", quota}}).ok());
    ASSERT_TRUE(call("job.create", job("web", 2)).ok());
    ASSERT_TRUE(wait_for(
        [&] {
          tasks("web");
          return ready_ == 2 && racks_.size() == 2;
        },
        20));
  }
  static json job(const std::string& name, int count) {
    return json{{"name", name},
                {"entitlement", "e"},
                {"count", count},
                {"max_unavailable", 1},
                {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
                {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  }
  // The job's ready tasks, the fault domains of its running ones, and their ids.
  void tasks(const std::string& name) {
    ready_ = 0;
    racks_.clear();
    ids_.clear();
    auto r = call("job.show", {{"name", name}});
    if (!r.ok()) return;
    for (const auto& t : (*r)["tasks"]) {
      ready_ += t["ready"].get<bool>();
      if (t["state"] == "running") {
        std::string m = t["machine"];
        racks_.insert(m == "a" || m == "b" ? "r0" : "r1");
        ids_.insert(t["id"].get<std::string>());
      }
    }
  }
  bool wait_for(const std::function<bool()>& done, int seconds) {
    for (int i = 0; i < seconds * 20 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return done();
  }
  // r1 fails (its machines stop answering) until the job is all in r0.
  void fail_r1() {
    c_.reboot();
    d_.reboot();
    ASSERT_TRUE(wait_for(
        [&] {
          tasks("web");
          return ready_ == 2 && racks_ == std::set<std::string>{"r0"};
        },
        30));
  }
  // r1 comes back: both its machines registered and healthy.
  void return_r1() {
    ASSERT_TRUE(c_.connect(sock()));
    ASSERT_TRUE(d_.connect(sock()));
    auto machines_ok = [&] {
      auto r = call("machine.ls");
      int ok = 0;
      if (r.ok())
        for (const auto& m : (*r)["machines"]) ok += m["state"] == "ok";
      return ok == 4;
    };
    ASSERT_TRUE(wait_for(machines_ok, 20)) << call("machine.ls")->dump();
  }
  // Until the job is in both domains again; the fewest ready tasks seen meanwhile.
  int wait_for_spread() {
    int lowest = 2;
    EXPECT_TRUE(wait_for(
        [&] {
          tasks("web");
          lowest = std::min(lowest, ready_);
          return ready_ == 2 && racks_.size() == 2;
        },
        30))
        << call("rebalance.status", {{"name", "e"}})->dump(2);
    return lowest;
  }
  FakeMachine a_{"a", "r0"}, b_{"b", "r0"}, c_{"c", "r1"}, d_{"d", "r1"};
  int ready_ = 0;
  std::set<std::string> racks_, ids_;
};

// The ReBalancer's loop (docs/rebalancer.md) against the real control plane: a fault
// domain fails (its machines go back to the free pool), the job's tasks all land in the
// other domain; the domain returns while the entitlement's rebalancing is paused:
// nothing moves; resumed, the loop moves one task back to the returned domain (a spare
// from the free pool joins the entitlement), make before break, the job never below
// count - max_unavailable ready; the move is in the audit log with its aim, and in
// `rebalance status`; the job that opted out never moves.
TEST_F(RebalancerLoop, TheRebalancerRestoresSpreadWhenADomainComesBack) {
  set_up(4);
  if (HasFatalFailure()) return;
  fail_r1();
  if (HasFatalFailure()) return;
  // A job that opts out, in r0 only now.
  json pinned = job("pinned", 1);
  pinned["rebalance"] = false;
  ASSERT_TRUE(call("job.create", pinned).ok());
  ASSERT_TRUE(wait_for(
      [&] {
        tasks("pinned");
        return ready_ == 1;
      },
      20));
  const std::set<std::string> pinned_ids = ids_;
  auto paused = call("rebalance.pause", {{"name", "e"}, {"paused", true}});
  ASSERT_TRUE(paused.ok()) << paused.error().str();
  // r1 comes back: paused, nothing moves for three rounds.
  return_r1();
  if (HasFatalFailure()) return;
  std::this_thread::sleep_for(std::chrono::seconds(3));
  tasks("web");
  EXPECT_EQ(racks_, std::set<std::string>{"r0"});
  auto st = call("rebalance.status", {{"name", "e"}});
  ASSERT_TRUE(st.ok()) << st.error().str();
  EXPECT_EQ((*st)["paused"], true) << st->dump();
  EXPECT_EQ((*st)["outcome"], "paused") << st->dump();
  auto plan = call("rebalance.plan", {{"name", "e"}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)["before"]["spread_violations"], 1) << plan->dump();
  EXPECT_EQ((*plan)["after"]["spread_violations"], 0) << plan->dump();

  // Resumed: one task goes back to r1, never leaving the job below 1 ready_ task.
  ASSERT_TRUE(call("rebalance.pause", {{"name", "e"}, {"paused", false}}).ok());
  EXPECT_GE(wait_for_spread(), 1);
  // Done: the status says so, and the audit log has the move with its aim.
  ASSERT_TRUE(wait_for(
      [&] {
        auto s = call("rebalance.status", {{"name", "e"}});
        if (!s.ok()) return false;
        for (const auto& m : (*s)["recent"])
          if (m["result"] == "done" && m["aim"] == "spread over fault domains") return true;
        return false;
      },
      10))
      << call("rebalance.status", {{"name", "e"}})->dump(2);
  st = call("rebalance.status", {{"name", "e"}});
  ASSERT_TRUE(st.ok());
  EXPECT_GE((*st)["moves_last_hour"].get<int>(), 1) << st->dump();
  EXPECT_EQ((*st)["paused"], false);
  auto audit = call("audit.ls", {{"limit", 200}});
  ASSERT_TRUE(audit.ok()) << audit.error().str();
  int spread_moves = 0;
  for (const auto& e : (*audit)["entries"]) {
    if (e["role"] != "rebalancer") continue;
    std::string result = e["result"];
    EXPECT_EQ(result.find("job pinned"), std::string::npos) << result;
    spread_moves += result.find("job web") != std::string::npos &&
                    result.find("spread over fault domains") != std::string::npos;
  }
  EXPECT_GE(spread_moves, 1) << audit->dump(2);
  tasks("pinned");
  EXPECT_EQ(ids_, pinned_ids);  // opted out: never moved

  // weftctl, and bad input naming the field.
  auto [rc, text] = weftctl("rebalance status e");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("entitlement e: rebalancing"), std::string::npos) << text;
  EXPECT_NE(text.find("spread over fault domains"), std::string::npos) << text;
  auto bad = call("rebalance.pause", {{"name", "e"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("paused: ", 0), 0u) << bad.error().str();
  bad = call("rebalance.pause", {{"name", "e"}, {"paused", 1}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("paused: ", 0), 0u) << bad.error().str();
  EXPECT_EQ(call("rebalance.pause", {{"name", "nope"}, {"paused", true}}).error().code,
            rpc::kNotFound);
  EXPECT_EQ(call("rebalance.status", json::object()).error().message.rfind("name: ", 0), 0u);
  EXPECT_EQ(call("rebalance.status", {{"name", "nope"}}).error().code, rpc::kNotFound);
}

// An entitlement at its quota when the domain comes back: no room for another machine,
// so the spread is restored by a swap: the task alone on its machine moves to a returned
// machine, and the machine it left goes back to the free pool; the entitlement holds its
// quota's two machines again once the move is done.
TEST_F(RebalancerLoop, AtItsQuotaTheSpreadIsRestoredByASwap) {
  set_up(2);
  if (HasFatalFailure()) return;
  fail_r1();
  if (HasFatalFailure()) return;
  return_r1();
  if (HasFatalFailure()) return;
  EXPECT_GE(wait_for_spread(), 1);
  auto held = [&] {
    auto r = call("entitlement.show", {{"name", "e"}});
    return r.ok() ? (*r)["machines"].size() : size_t{0};
  };
  EXPECT_TRUE(wait_for([&] { return held() == 2; }, 10))
      << call("entitlement.show", {{"name", "e"}})->dump();
  auto st = call("rebalance.status", {{"name", "e"}});
  ASSERT_TRUE(st.ok());
  EXPECT_GE((*st)["moves_last_hour"].get<int>(), 1) << st->dump();
}

// What the leader kept in memory survives its SIGKILL (store/notes.h): the next one shows
// the same ReBalancer budget spent and the same recent moves (its rounds would otherwise
// start with a full hourly budget), and the same job events under the same numbers.
TEST_F(RebalancerLoop, ANewLeaderKeepsTheBudgetSpentTheMovesAndTheEvents) {
  set_up(2);
  if (HasFatalFailure()) return;
  fail_r1();
  if (HasFatalFailure()) return;
  return_r1();
  if (HasFatalFailure()) return;
  EXPECT_GE(wait_for_spread(), 1);
  json before;
  ASSERT_TRUE(wait_for(
      [&] {
        auto r = call("rebalance.status", {{"name", "e"}});
        if (!r.ok() || !(*r)["moving"].empty() || (*r)["moves_last_hour"] < 1) return false;
        before = *r;
        return true;
      },
      20))
      << before.dump(2);
  auto events = call("job.events", {{"name", "web"}, {"limit", 1000}});
  ASSERT_TRUE(events.ok()) << events.error().str();
  ASSERT_FALSE((*events)["events"].empty());
  // An acknowledged change to the job: its events up to it are kept with it.
  auto scaled = call("job.scale", {{"name", "web"}, {"count", 3}});
  ASSERT_TRUE(scaled.ok()) << scaled.error().str();
  stop(SIGKILL);
  start();
  if (HasFatalFailure()) return;
  for (FakeMachine* m : {&a_, &b_, &c_, &d_}) {
    m->disconnect();
    ASSERT_TRUE(m->connect(sock()));
  }
  auto after = call("rebalance.status", {{"name", "e"}});
  ASSERT_TRUE(after.ok()) << after.error().str();
  EXPECT_EQ((*after)["moves_last_hour"], before["moves_last_hour"]) << after->dump(2);
  EXPECT_EQ((*after)["recent"], before["recent"]) << after->dump(2);
  EXPECT_EQ((*after)["last_plan"], before["last_plan"]) << after->dump(2);
  auto again = call("job.events", {{"name", "web"}, {"limit", 1000}});
  ASSERT_TRUE(again.ok()) << again.error().str();
  ASSERT_GE((*again)["events"].size(), (*events)["events"].size());
  for (size_t i = 0; i < (*events)["events"].size(); ++i)
    EXPECT_EQ((*again)["events"][i], (*events)["events"][i]) << i;
  // And the numbers go on: what happens now (the third task running) comes after them.
  json newer;
  EXPECT_TRUE(wait_for(
      [&] {
        auto r = call("job.events", {{"name", "web"}, {"after", (*events)["next"]}});
        if (!r.ok() || (*r)["events"].empty()) return false;
        newer = *r;
        return true;
      },
      20));
  if (!newer.is_null()) {
    EXPECT_GT(newer["events"][0]["seq"].get<uint64_t>(), (*events)["next"].get<uint64_t>());
  }
}

// `top` through the control plane (docs/operations.md): the agents' figures by job, task
// and machine, with what was reserved and the machines' capacity; filters; a machine
// without a session is named, not waited for; bad input names the field; weftctl top.
TEST_F(ControlPlane, TopShowsWhatTheAgentsMeasuredByJobTaskAndMachine) {
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0"), b("b", "r1");
  a.set_cpu_milli(300);
  b.set_cpu_milli(700);
  for (FakeMachine* m : {&a, &b}) {
    ASSERT_TRUE(m->connect(sock()));
    m->keep_alive();
  }
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 2}}).ok());
  ASSERT_TRUE(call("job.create", {{"name", "web"},
                                  {"entitlement", "e"},
                                  {"count", 2},
                                  {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
                                  {"task", {{"argv", {"/bin/sleep", "infinity"}}}}})
                  .ok());
  for (int i = 0; i < 200; ++i) {
    auto r = call("job.ls");
    if (r.ok() && !(*r)["jobs"].empty() && (*r)["jobs"][0]["ready"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto jobs = call("top", json::object());
  ASSERT_TRUE(jobs.ok()) << jobs.error().str();
  ASSERT_EQ((*jobs)["rows"].size(), 1u) << jobs->dump();
  const json& web = (*jobs)["rows"][0];
  EXPECT_EQ(web["job"], "web");
  EXPECT_EQ(web["entitlement"], "e");
  EXPECT_EQ(web["tasks"], 2);
  EXPECT_EQ(web["measured"], 2);
  EXPECT_EQ(web["cpu_milli"], 1000);
  EXPECT_EQ(web["mem_bytes"], 2 * (64 << 20));
  EXPECT_EQ(web["cpu_request_milli"], 1000);
  EXPECT_EQ((*jobs)["interval_ms"], 1000);
  EXPECT_TRUE((*jobs)["silent"].empty());
  auto tasks = call("top", {{"of", "tasks"}});
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ((*tasks)["rows"].size(), 2u) << tasks->dump();
  EXPECT_EQ((*tasks)["rows"][0]["machine"], "b");  // the busiest first
  EXPECT_EQ((*tasks)["rows"][0]["cpu_milli"], 700);
  EXPECT_EQ((*tasks)["rows"][1]["cpu_milli"], 300);
  auto machines = call("top", {{"of", "machines"}});
  ASSERT_TRUE(machines.ok());
  ASSERT_EQ((*machines)["rows"].size(), 2u);
  EXPECT_EQ((*machines)["rows"][0]["machine"], "b");
  EXPECT_EQ((*machines)["rows"][0]["cpu_capacity_milli"], 4000);
  auto on_a = call("top", {{"of", "tasks"}, {"machine", "a"}});
  ASSERT_TRUE(on_a.ok());
  ASSERT_EQ((*on_a)["rows"].size(), 1u);
  EXPECT_EQ((*on_a)["rows"][0]["cpu_milli"], 300);
  EXPECT_TRUE((*call("top", {{"job", "nope"}}))["rows"].empty());
  EXPECT_TRUE((*call("top", {{"entitlement", "other"}}))["rows"].empty());
  // weftctl top.
  auto [rc, text] = weftctl("top tasks");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("0.70"), std::string::npos) << text;  // b's task: 0.7 of a core
  EXPECT_NE(text.find("web."), std::string::npos) << text;
  // b's agent gone (not dead yet): named, and its task left unmeasured.
  b.stop_keep_alive();
  b.disconnect();
  json silent;
  for (int i = 0; i < 100; ++i) {
    auto r = call("top", json::object());
    ASSERT_TRUE(r.ok());
    silent = *r;
    if (!(*r)["silent"].empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(silent["silent"], json::array({"b"})) << silent.dump();
  EXPECT_EQ(silent["rows"][0]["measured"], 1) << silent.dump();
  // Bad input names the field.
  for (const json& bad : {json{{"of", "bogus"}}, json{{"of", 3}}, json{{"job", 3}}}) {
    auto r = call("top", bad);
    ASSERT_FALSE(r.ok()) << bad.dump();
    std::string field = bad.begin().key();
    EXPECT_EQ(r.error().message.rfind(field + ": ", 0), 0u) << r.error().str();
  }
}

}  // namespace
}  // namespace weft::testing
