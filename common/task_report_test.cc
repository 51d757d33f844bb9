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

}  // namespace
}  // namespace weft
