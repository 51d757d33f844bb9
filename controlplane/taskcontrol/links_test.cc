// A TaskController's answer is hostile input like any other: only {"seq": <the plan's>,
// "ack": [ids]} is taken, and errors name the field.
#include "controlplane/taskcontrol/links.h"
#include "common/clock.h"

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

namespace weft::cp {
namespace {

// The plan a controller is asked about, built from the scheduler, the allocator and the
// maintenance calendar alone (no daemon).
TEST(BuildPlan, TasksOperationsAndTheMaintenanceOfTheJobsMachines) {
  Allocator alloc;
  std::vector<MachineId> ids;
  for (int d = 0; d < 3; ++d)
    ids.push_back(alloc.add_machine(
        {"m" + std::to_string(d), "dc1", "rack" + std::to_string(d), "a", {4000, 8192}}));
  for (MachineId m : ids) ASSERT_TRUE(alloc.assign(m, 1).ok());
  Scheduler sched(alloc, SchedulerLimits{60, 20});
  JobSpec s;
  s.name = "web";
  s.count = 2;
  s.max_unavailable = 1;
  s.per_task = {1000, 1024};
  s.task = {{"argv", {"/bin/sleep", "infinity"}}};
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  auto started = sched.create(s, 0);
  ASSERT_TRUE(started.ok());
  for (MachineId m : ids) {
    std::map<std::string, TaskState> on;
    for (const auto& c : *started)
      if (c.machine == m) on[c.task_id] = TaskState::kReady;
    sched.report(m, on, 1);
  }
  MachineId drained = (*started)[0].machine;
  std::string task = (*started)[0].task_id;
  std::string machine = alloc.spec(drained).name;
  alloc.set_usable(drained, false, true, true);
  ASSERT_TRUE(sched.moves().machine_drain(drained, 2).empty());  // waits for the controller

  Maintenance maintenance;
  MaintenanceEvent e;
  e.id = 7;
  e.start_us = 1'800'000'000'000'000;
  e.duration_us = 3'600'000'000;
  e.reason = "kernel 6.19";
  e.state = "notified";
  e.machines = {machine};
  maintenance.restore(e);
  MaintenanceEvent elsewhere = e;  // another machine's: not in this job's plan
  elsewhere.id = 8;
  elsewhere.machines = {"m-other"};
  maintenance.restore(elsewhere);

  auto plan = build_plan("web", sched, alloc, maintenance, {"restart/old"});
  EXPECT_EQ(plan.at("job"), "web");
  EXPECT_EQ(plan.at("count"), 2);
  EXPECT_EQ(plan.at("max_unavailable"), 1);
  ASSERT_EQ(plan.at("tasks").size(), 2u);
  for (const auto& t : plan.at("tasks")) {
    EXPECT_EQ(t.at("state"), "running");
    EXPECT_TRUE(t.at("ready").get<bool>());
  }
  ASSERT_EQ(plan.at("pending").size(), 1u);
  const auto& op = plan.at("pending")[0];
  EXPECT_EQ(op.at("op"), "move/" + task);
  EXPECT_EQ(op.at("maintenance"), 7);
  EXPECT_EQ(op.at("reason"), "maintenance 7: kernel 6.19");
  EXPECT_EQ(op.at("deadline"), format_rfc3339(e.start_us));
  ASSERT_EQ(plan.at("maintenance").size(), 1u);
  EXPECT_EQ(plan.at("maintenance")[0].at("id"), 7);
  EXPECT_EQ(plan.at("maintenance")[0].at("machines"), nlohmann::json::array({machine}));
  EXPECT_EQ(plan.at("completed"), nlohmann::json::array({"restart/old"}));

  auto unknown = build_plan("nope", sched, alloc, maintenance, {});
  EXPECT_EQ(unknown.at("count"), 0);
  EXPECT_TRUE(unknown.at("tasks").empty());
}

}  // namespace
}  // namespace weft::cp
