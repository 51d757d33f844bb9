#include "common/task_report.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

using json = nlohmann::json;

TEST(TaskReport, AWholeListCarriesItsOwnDigest) {
  auto r = parse_task_report(
      {{"machine", "m1"}, {"tasks", {{"b.0.2", "running"}, {"a.1.1", "exited"}}}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_TRUE(r->tasks);
  ASSERT_EQ(r->tasks->size(), 2u);
  EXPECT_EQ((*r->tasks)[0].first, "a.1.1");  // in id order, whatever the sender's order
  EXPECT_EQ((*r->tasks)[1].second, TaskState::kRunning);
  // The agent's digest of the same list (its state names) is the one computed here.
  EXPECT_EQ(r->digest, tasks_digest(std::map<std::string, std::string>{{"a.1.1", "exited"},
                                                                       {"b.0.2", "running"}}));
  EXPECT_EQ(r->digest.size(), 32u);
  // Any change of a state, an id or the set changes it.
  EXPECT_NE(r->digest, tasks_digest(std::map<std::string, std::string>{{"a.1.1", "failed"},
                                                                       {"b.0.2", "running"}}));
  EXPECT_NE(r->digest, tasks_digest(std::map<std::string, std::string>{{"b.0.2", "running"}}));
  EXPECT_NE(tasks_digest(std::map<std::string, std::string>{}), r->digest);
}

TEST(TaskReport, ADigestAloneIsCheckedAndErrorsNameTheField) {
  std::string d = tasks_digest(std::map<std::string, std::string>{});
  auto r = parse_task_report({{"machine", "m1"}, {"digest", d}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->tasks);
  EXPECT_EQ(r->digest, d);
  struct Bad {
    json params;
    const char* field;
  };
  for (const auto& b : std::vector<Bad>{
           {json{{"machine", "m1"}}, "tasks"},
           {json{{"digest", "xyz"}}, "digest"},
           {json{{"digest", std::string(32, 'G')}}, "digest"},
           {json{{"digest", 7}}, "digest"},
           {json{{"tasks", json::array()}}, "tasks"},
           {json{{"tasks", {{"a.0.1", "sleeping"}}}}, "tasks.a.0.1"},
           {json{{"tasks", {{"a.0.1", 3}}}}, "tasks.a.0.1"},
           {json("not an object"), "params"},
       }) {
    auto e = parse_task_report(b.params);
    ASSERT_FALSE(e.ok()) << b.params.dump();
    EXPECT_EQ(e.error().field, b.field) << b.params.dump();
  }
  json many = json::object();
  for (size_t i = 0; i <= kMaxReportedTasks; ++i) many["t." + std::to_string(i) + ".1"] = "running";
  auto big = parse_task_report({{"tasks", many}});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().field, "tasks");
}

TEST(TaskReport, TheDigestIsKeptUpToDateEntryByEntry) {
  using States = std::map<std::string, std::string>;
  States a{{"a.0.1", "running"}, {"b.1.2", "exited"}, {"c.0.3", "running"}};
  TaskDigest d;
  d.add("c.0.3", "running");  // in any order
  d.add("a.0.1", "running");
  d.add("b.1.2", "exited");
  EXPECT_EQ(d.hex(), tasks_digest(a));
  d.remove("b.1.2", "exited");
  a.erase("b.1.2");
  EXPECT_EQ(d.hex(), tasks_digest(a));
  d.remove("a.0.1", "running");
  d.remove("c.0.3", "running");
  EXPECT_EQ(d.hex(), tasks_digest(States{}));
  EXPECT_EQ(d.hex(), std::string(32, '0'));
  // Entries do not cancel: a state moved from one task to another changes the digest.
  EXPECT_NE(tasks_digest(States{{"a", "running"}, {"b", "exited"}}),
            tasks_digest(States{{"a", "exited"}, {"b", "running"}}));
}

TEST(TaskReport, ChangesApplyToTheHeldListAndItsDigest) {
  using States = std::map<std::string, std::string>;
  States acked{{"a.0.1", "running"}, {"b.0.1", "running"}, {"c.0.1", "exited"}};
  States now{{"a.0.1", "running"}, {"b.0.1", "failed"}, {"d.0.1", "running"}};
  json changes = task_changes_json(acked, now);
  EXPECT_EQ(changes, (json{{"b.0.1", "failed"}, {"c.0.1", nullptr}, {"d.0.1", "running"}}));
  auto r = parse_task_report(
      {{"base", tasks_digest(acked)}, {"changes", changes}, {"digest", tasks_digest(now)}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_TRUE(r->changes);
  EXPECT_FALSE(r->tasks);
  EXPECT_EQ(r->base, tasks_digest(acked));
  TaskList held{{"a.0.1", TaskState::kRunning},
                {"b.0.1", TaskState::kRunning},
                {"c.0.1", TaskState::kExited}};
  TaskDigest sum;
  for (const auto& [id, st] : held) sum.add(id, task_state_name(st));
  auto applied = apply_task_changes(held, sum, *r->changes);
  EXPECT_EQ(applied.size(), 3u);
  EXPECT_EQ(held, (TaskList{{"a.0.1", TaskState::kRunning},
                            {"b.0.1", TaskState::kFailed},
                            {"d.0.1", TaskState::kRunning}}));
  EXPECT_EQ(sum.hex(), r->digest);
  // Removing what the list does not hold changes nothing (and is not reported applied).
  applied = apply_task_changes(held, sum, {{"zz.0.1", std::nullopt}});
  EXPECT_TRUE(applied.empty());
  EXPECT_EQ(sum.hex(), r->digest);
  // Errors name the field.
  struct Bad {
    json params;
    const char* field;
  };
  std::string d = tasks_digest(now);
  for (const auto& b : std::vector<Bad>{
           {json{{"changes", json::object()}, {"digest", d}}, "base"},
           {json{{"changes", json::object()}, {"base", d}}, "digest"},
           {json{{"changes", json::array()}, {"base", d}, {"digest", d}}, "changes"},
           {json{{"changes", {{"a.0.1", "dozing"}}}, {"base", d}, {"digest", d}}, "changes.a.0.1"},
           {json{{"changes", {{"a.0.1", 1}}}, {"base", d}, {"digest", d}}, "changes.a.0.1"},
       }) {
    auto e = parse_task_report(b.params);
    ASSERT_FALSE(e.ok()) << b.params.dump();
    EXPECT_EQ(e.error().field, b.field) << b.params.dump();
  }
}

// Reasons beside the list: outside the digest; a long one is cut, a malformed one named.
TEST(TaskReport, FailuresCarryTheMachinesReasons) {
  json tasks{{"a.0.1", "failed"}, {"b.0.1", "running"}};
  std::string long_reason(600, 'x');
  long_reason[weft::kMaxFailureReason - 1] = '\xc3';  // a two-byte character across the cut
  long_reason[weft::kMaxFailureReason] = '\xa9';
  auto r = parse_task_report(
      {{"tasks", tasks},
       {"failures",
        {{"a.0.1", {{"reason", "task setup failed: pivot_root: busy"}, {"setup", true}}},
         {"c.0.1", {{"reason", long_reason}}}}}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->digest,
            tasks_digest(TaskList{{"a.0.1", TaskState::kFailed}, {"b.0.1", TaskState::kRunning}}));
  ASSERT_EQ(r->failures.size(), 2u);
  EXPECT_EQ(r->failures["a.0.1"].reason, "task setup failed: pivot_root: busy");
  EXPECT_TRUE(r->failures["a.0.1"].setup);
  EXPECT_FALSE(r->failures["c.0.1"].setup);
  EXPECT_EQ(r->failures["c.0.1"].reason, long_reason.substr(0, weft::kMaxFailureReason - 1));
  for (const auto& [failures, field] : std::vector<std::pair<json, std::string>>{
           {json::array(), "failures"},
           {{{"a.0.1", "busy"}}, "failures.a.0.1"},
           {{{"a.0.1", {{"setup", true}}}}, "failures.a.0.1.reason"},
           {{{"a.0.1", {{"reason", "x"}, {"setup", "yes"}}}}, "failures.a.0.1.setup"}}) {
    auto e = parse_task_report({{"tasks", tasks}, {"failures", failures}});
    ASSERT_FALSE(e.ok()) << failures.dump();
    EXPECT_EQ(e.error().field, field) << e.error().str();
  }
}

}  // namespace
}  // namespace weft
