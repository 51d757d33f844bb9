#include "agent/cp_session.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "common/clock.h"
#include "common/fs.h"
#include "common/rpc/server.h"
#include "common/strings.h"
#include "common/task_report.h"

namespace weft::agent {
namespace {

ReportedTask in(const char* state) {
  return ReportedTask{state};
}

// Each report is read back by the control plane's own reader (common/task_report.h).
TaskReport read_back(const Report& r) {
  auto parsed = parse_task_report(r.params);
  EXPECT_TRUE(parsed.ok()) << (parsed.ok() ? "" : parsed.error().str());
  return parsed.ok() ? *parsed : TaskReport{};
}

TEST(CpReport, AWholeListFirstThenOnlyTheDigestWhileNothingChanges) {
  std::map<std::string, ReportedTask> tasks{{"web.0", in("ready")}, {"web.1", in("running")}};
  Report first = build_report("m1", tasks, {}, "");
  EXPECT_EQ(first.params.at("machine"), "m1");
  TaskReport whole = read_back(first);
  ASSERT_TRUE(whole.tasks);
  EXPECT_EQ(whole.tasks->size(), 2u);
  EXPECT_EQ(whole.digest, first.digest);  // the control plane computes the same digest

  Report again = build_report("m1", tasks, first.states, first.digest);
  EXPECT_FALSE(again.params.contains("tasks"));
  EXPECT_FALSE(again.params.contains("changes"));
  EXPECT_EQ(again.params.at("digest"), first.digest);
}

TEST(CpReport, ChangesAgainstTheAcknowledgedListCarryTheBaseAndTheNewDigest) {
  std::map<std::string, ReportedTask> tasks{{"web.0", in("ready")}, {"web.1", in("running")}};
  Report first = build_report("m1", tasks, {}, "");
  tasks["web.1"] = in("ready");
  tasks.erase("web.0");
  tasks["web.2"] = in("starting");
  Report next = build_report("m1", tasks, first.states, first.digest);
  TaskReport changes = read_back(next);
  ASSERT_TRUE(changes.changes);
  EXPECT_EQ(changes.base, first.digest);
  EXPECT_EQ(changes.digest, next.digest);
  ASSERT_EQ(changes.changes->size(), 3u);  // web.0 gone, web.1 ready, web.2 new
  TaskList list;
  TaskDigest digest;
  for (const auto& [name, state] : first.states) {
    list.emplace_back(name, *parse_task_state(state));
    digest.add(name, state);
  }
  apply_task_changes(list, digest, *changes.changes);
  EXPECT_EQ(digest.hex(), next.digest);  // the control plane's copy agrees after applying
}

TEST(CpReport, FailuresAreNamedOnlyForFailedTasksTheReportCarriesAndAreCut) {
  std::map<std::string, ReportedTask> tasks{{"web.0", in("running")}};
  ReportedTask failed{"failed", true, std::string(5000, 'x'), true};
  tasks["web.1"] = failed;
  Report first = build_report("m1", tasks, {}, "");
  TaskReport whole = read_back(first);
  ASSERT_EQ(whole.failures.size(), 1u);
  EXPECT_TRUE(whole.failures.at("web.1").setup);
  EXPECT_LT(whole.failures.at("web.1").reason.size(), kMaxFailureReason);

  // Unchanged since acknowledged: no list, so no failures either.
  Report again = build_report("m1", tasks, first.states, first.digest);
  EXPECT_FALSE(again.params.contains("failures"));
  // A change elsewhere: the failed task is not in the changes, nor in the failures.
  tasks["web.0"] = in("ready");
  Report next = build_report("m1", tasks, first.states, first.digest);
  EXPECT_FALSE(next.params.contains("failures"));
}

// A session with a control plane that takes quiet heartbeats (docs/protocol.md): while
// nothing changes and the control plane spoke within an interval and a half, the digest
// goes as a notification; every other heartbeat stays a request; report.resend brings the
// whole list at once and report.forget reaches the agent's hook. One that does not say
// it takes them gets requests only.
class QuietHeartbeats : public ::testing::TestWithParam<bool> {};

TEST_P(QuietHeartbeats, AnUnchangedMachinesHeartbeatIsQuietWhileTheControlPlaneSpeaks) {
  const bool quiet = GetParam();
  std::string dir = std::filesystem::temp_directory_path() / ("weft-quiet-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  auto loop = std::move(EventLoop::create()).value();
  rpc::Dispatcher cp;
  int calls = 0, notes = 0, wholes = 0;
  rpc::Session* agent = nullptr;
  cp.add("machine.register", [&](const nlohmann::json&, const rpc::CallContext& c) {
    agent = c.session;
    return Result<nlohmann::json>(
        nlohmann::json{{"heartbeat_interval_ms", 100}, {"quiet_heartbeats", quiet}});
  });
  bool hold = false;  // the next request's answer waits in `held`
  rpc::ReplyFn held;
  cp.add("machine.report", [&](const nlohmann::json& p, const rpc::CallContext& c) {
    (c.session->answering() ? calls : notes)++;
    wholes += p.contains("tasks");
    if (hold && c.session->answering()) {
      hold = false;
      held = c.session->defer_reply();
    }
    return Result<nlohmann::json>(nlohmann::json::object());
  });
  rpc::Server server(*loop, &cp);
  ASSERT_TRUE(server.listen_unix(dir + "/cp.sock", 0600).ok());
  AgentConfig cfg;
  cfg.machine_id = "m1";
  cfg.control_plane = dir + "/cp.sock";
  cfg.cgroup_root = dir;
  std::set<std::string> forgotten;
  CpSession::Hooks hooks;
  hooks.tasks = [] { return std::map<std::string, ReportedTask>{{"web.0.1", in("ready")}}; };
  hooks.forget = [&](const std::set<std::string>& names) { forgotten = names; };
  rpc::Dispatcher commands;
  std::unique_ptr<CpSession> session;
  commands.add("report.resend", [&](const nlohmann::json&, const rpc::CallContext&) {
    session->resend();
    return Result<nlohmann::json>(nlohmann::json::object());
  });
  commands.add("report.forget", [&](const nlohmann::json& p, const rpc::CallContext&) {
    session->forget(p);
    return Result<nlohmann::json>(nlohmann::json::object());
  });
  auto started = CpSession::start(*loop, cfg, &commands, false, hooks);
  ASSERT_TRUE(started.ok()) << started.error().str();
  session = std::move(started).value();
  // Until `done`, or 20 s (a loaded machine under the sanitizers is slow, not wrong).
  auto run_until = [&](const std::function<bool()>& done, uint64_t for_us = 20'000'000) {
    auto until = now_monotonic_us() + for_us;
    while (!done() && now_monotonic_us() < until) (void)loop->run_once(10'000);
  };
  // About a dozen heartbeats.
  run_until([&] { return calls >= 3 && (quiet ? notes >= 3 : calls >= 12); });
  EXPECT_EQ(wholes, 1);
  EXPECT_GE(calls, 3) << "a control plane that stopped answering would not be noticed";
  if (!quiet) {
    EXPECT_EQ(notes, 0);
  } else {
    EXPECT_GE(notes, 3);
    ASSERT_NE(agent, nullptr);
    // The whole list comes at once.
    agent->notify("report.resend", nlohmann::json::object());
    run_until([&] { return wholes >= 2; });
    EXPECT_EQ(wholes, 2);
    // Also when the resend meets a report in flight: that report's answer, which comes
    // after, must not stand for the list.
    hold = true;
    run_until([&] { return held != nullptr; });
    ASSERT_TRUE(held);
    agent->notify("report.resend", nlohmann::json::object());
    run_until([&] { return false; }, 200'000);
    EXPECT_EQ(wholes, 2);  // one report at a time: the list waits for the answer
    held(nlohmann::json::object());
    run_until([&] { return wholes >= 3; });
    EXPECT_EQ(wholes, 3);
    agent->notify("report.forget", {{"forget", {"web.0.0", "web.0.9"}}});
    run_until([&] { return !forgotten.empty(); });
    EXPECT_EQ(forgotten, (std::set<std::string>{"web.0.0", "web.0.9"}));
  }
  session.reset();
  (void)remove_tree(dir);
}
INSTANTIATE_TEST_SUITE_P(CpSession, QuietHeartbeats, ::testing::Bool());

TEST(HolderFence, CommandsFromTheHolderPassWithoutTheFieldsAndOthersAreRefused) {
  HolderFence f;
  nlohmann::json run{{"name", "web.0.0"}, {"argv", {"/bin/true"}}};
  // An all-in-one control plane names no holder: its commands pass as they are.
  f.registered({{"machine", "m1"}});
  auto plain = f.admit(run, "task.run");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, run);

  f.registered({{"machine", "m1"}, {"holder", {{"shard", "s1"}, {"epoch", 7}}}});
  EXPECT_EQ(f.holder(), "s1");
  EXPECT_EQ(f.epoch(), 7u);
  nlohmann::json fenced = run;
  fenced["holder"] = "s1";
  fenced["epoch"] = 7;
  auto ok = f.admit(fenced, "task.run");
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(*ok, run) << "the fields are taken off: the task spec's validator is strict";
  fenced["epoch"] = 8;  // newer than the registration said: the holder's own, later
  EXPECT_TRUE(f.admit(fenced, "task.run").ok());

  // From before the machine moved (an older epoch), or from another shard: refused.
  fenced["epoch"] = 6;
  auto old = f.admit(fenced, "task.stop");
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.error().code, rpc::kConflict);
  EXPECT_NE(old.error().message.find("task.stop"), std::string::npos) << old.error().str();
  fenced["epoch"] = 7;
  fenced["holder"] = "s2";
  EXPECT_EQ(f.admit(fenced, "task.run").error().code, rpc::kConflict);
  // Held by a shard: a command that names no holder is refused, as is a malformed fence.
  EXPECT_EQ(f.admit(run, "task.run").error().code, rpc::kConflict);
  for (const nlohmann::json& bad :
       {nlohmann::json{{"holder", 1}, {"epoch", 7}},
        nlohmann::json{{"holder", "s1"}, {"epoch", -1}}, nlohmann::json{{"holder", "s1"}},
        nlohmann::json{{"epoch", 7}}}) {
    auto r = f.admit(bad, "task.run");
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_FALSE(r.error().field.empty()) << bad.dump();
  }
  // A registration that names no holder (the machine went back to an all-in-one, or the
  // reply is malformed) forgets the old one: the old shard's commands are refused.
  f.registered({{"holder", {{"shard", 5}, {"epoch", "x"}}}});
  EXPECT_EQ(f.holder(), "");
  fenced["holder"] = "s1";
  EXPECT_FALSE(f.admit(fenced, "task.run").ok());
}

}  // namespace
}  // namespace weft::agent
