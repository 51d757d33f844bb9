// A TaskController's answer is hostile input like any other: only {"seq": <the plan's>,
// "ack": [ids]} is taken, and errors name the field.
#include "controlplane/task_control.h"

#include <gtest/gtest.h>

namespace weft::cp {
namespace {

using json = nlohmann::json;

TEST(TaskControl, OnlyAWellFormedAnswerToThisPlanIsTaken) {
  auto ok = parse_plan_answer({{"seq", 7}, {"ack", {"restart/web.0.1", "restart/web.2.3"}}}, 7);
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(*ok, (std::vector<std::string>{"restart/web.0.1", "restart/web.2.3"}));
  EXPECT_TRUE(parse_plan_answer({{"seq", 7}, {"ack", json::array()}}, 7)->empty());
  struct Bad {
    json answer;
    const char* field;
  };
  json many = json::array();
  for (size_t i = 0; i <= kMaxAcks; ++i) many.push_back("x");
  for (const auto& b : std::vector<Bad>{
           {json::array(), "result"},
           {json{{"ack", json::array()}}, "seq"},
           {json{{"seq", 6}, {"ack", json::array()}}, "seq"},  // an answer to an older plan
           {json{{"seq", -7}, {"ack", json::array()}}, "seq"},
           {json{{"seq", "7"}, {"ack", json::array()}}, "seq"},
           {json{{"seq", 7}}, "ack"},
           {json{{"seq", 7}, {"ack", "restart/web.0.1"}}, "ack"},
           {json{{"seq", 7}, {"ack", {1, 2}}}, "ack"},
           {json{{"seq", 7}, {"ack", {std::string(301, 'x')}}}, "ack"},
           {json{{"seq", 7}, {"ack", many}}, "ack"},
       }) {
    auto r = parse_plan_answer(b.answer, 7);
    ASSERT_FALSE(r.ok()) << b.answer.dump().substr(0, 200);
    EXPECT_EQ(r.error().field, b.field) << b.answer.dump().substr(0, 200);
  }
}

}  // namespace
}  // namespace weft::cp
