// Moving an entitlement between shards, the parts without processes: the document the
// old shard writes and the new one reads (strict, every error naming its field), and the
// scheduler's fence (while an entitlement moves, nothing acts for it) and its hand-over
// of a job (moved_job, adopt_job, forget_job) with nothing started again.
#include "controlplane/region/move_doc.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/rpc/protocol.h"
#include "controlplane/entitlements/profile_rolls.h"

namespace weft::cp {
namespace {

using json = nlohmann::json;

json seed() {
  std::ifstream in(std::string(WEFT_SOURCE_DIR) + "/fuzz/corpus/move/doc.json");
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

TEST(MoveDoc, AWrittenDocumentIsReadBackTheSame) {
  auto d = parse_move_doc(seed());
  ASSERT_TRUE(d.ok()) << d.error().str();
  EXPECT_EQ(d->entitlement.name, "web");
  EXPECT_TRUE(d->entitlement.rebalance_paused);
  ASSERT_EQ(d->machines.size(), 2u);
  EXPECT_EQ(d->machines[0].epoch, 3u);
  EXPECT_EQ(d->machines[0].verdict, "ok");       // HCS's verdict travels with it
  EXPECT_EQ(d->machines[1].verdict, "unknown");  // (absent: none heard)
  EXPECT_TRUE(d->machines[1].state.drained);
  ASSERT_EQ(d->jobs.size(), 1u);
  EXPECT_EQ(d->jobs[0].job.job.generation, 2u);
  EXPECT_EQ(d->jobs[0].job.granted, std::set<std::string>{"restart/site.1.4"});
  EXPECT_EQ(d->jobs[0].job.in_progress.at(0), "restart/site.0.3");
  EXPECT_EQ(d->jobs[0].placement, (std::vector<std::string>{"m1", "m2"}));
  ASSERT_EQ(d->tasks.size(), 2u);
  EXPECT_EQ(d->tasks[1].record.state, TaskState::kDraining);
  EXPECT_TRUE(d->tasks[1].record.ready);
  EXPECT_EQ(d->tasks[1].record.ports.at("http"), 20001);
  EXPECT_EQ(d->task_seq, 5u);
  ASSERT_TRUE(d->profile_roll.has_value());
  EXPECT_EQ(d->profile_roll->from, "old");
  EXPECT_EQ(d->profile_roll->waiting, std::vector<std::string>{"m2"});
  EXPECT_EQ(d->profile_roll->applying, std::vector<std::string>{"m1"});
  json again = move_doc_to_json(*d);
  auto back = parse_move_doc(again);
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(move_doc_to_json(*back), again);
}

TEST(MoveDoc, WhatDoesNotHoldTogetherIsRefusedWithItsFieldNamed) {
  struct Bad {
    std::function<void(json&)> change;
    std::string field;
  };
  const Bad cases[] = {
      {[](json& j) { j["tasks"][0]["machine"] = "m9"; }, "tasks[0].machine"},
      {[](json& j) { j["entitlement"]["rebalance_paused"] = "yes"; },
       "entitlement.rebalance_paused"},
      {[](json& j) { j["tasks"][1]["job"] = "other"; }, "tasks[1].job"},
      {[](json& j) { j["tasks"][1]["id"] = "other.1.4"; }, "tasks[1].id"},
      {[](json& j) { j["tasks"][0]["state"] = "dancing"; }, "tasks[0].state"},
      {[](json& j) { j["tasks"].push_back(j["tasks"][0]); }, "tasks[2].id"},
      {[](json& j) { j["jobs"][0]["placement"] = {"m1"}; }, "jobs[0].placement"},
      {[](json& j) { j["jobs"][0]["placement"][1] = "m7"; }, "jobs[0].placement[1]"},
      {[](json& j) { j["jobs"][0]["spec"]["entitlement"] = "db"; }, "jobs[0].spec.entitlement"},
      {[](json& j) { j["jobs"][0]["generation"] = 0; }, "jobs[0].generation"},
      {[](json& j) { j["jobs"][0]["spec"]["count"] = -1; }, "jobs[0].spec"},
      {[](json& j) { j["machines"][1]["name"] = "m1"; }, "machines[1].name"},
      {[](json& j) { j["machines"][0]["name"] = "../etc"; }, "machines[0].name"},
      {[](json& j) { j["machines"][0]["port_first"] = 70000; }, "machines[0].port_first"},
      {[](json& j) { j["machines"][0]["epoch"] = -1; }, "machines[0].epoch"},
      {[](json& j) { j["machines"][0]["verdict"] = "great"; }, "machines[0].verdict"},
      {[](json& j) {
         j["entitlement"]["grants"] = {{"users", {"root"}}};
       },
       "entitlement.grants"},
      {[](json& j) { j.erase("task_seq"); }, "task_seq"},
      {[](json& j) { j["profile_roll"]["waiting"][0] = "m9"; }, "profile_roll.waiting[0]"},
      {[](json& j) { j["profile_roll"]["pace"] = 0; }, "profile_roll.pace"},
      {[](json& j) { j = json::array(); }, "document"},
  };
  for (const auto& c : cases) {
    json j = seed();
    c.change(j);
    auto d = parse_move_doc(j);
    ASSERT_FALSE(d.ok()) << c.field;
    EXPECT_NE(d.error().str().find(c.field), std::string::npos)
        << "want " << c.field << ", got: " << d.error().str();
  }
}

class Fence : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int d = 0; d < 4; ++d) {
      ids_.push_back(alloc_.add_machine(
          {"m" + std::to_string(d), "dc1", "rack" + std::to_string(d), "a", {4000, 8192}}));
      ASSERT_TRUE(alloc_.assign(ids_.back(), d < 2 ? 1 : 2).ok());
    }
  }
  JobSpec spec(const std::string& name, EntitlementId e, int count) {
    JobSpec s;
    s.name = name;
    s.entitlement_id = e;
    s.count = count;
    s.per_task = {1000, 1024};
    s.task = {{"argv", {"/bin/sleep", "infinity"}}};
    return s;
  }
  // Machine m reports every task it was started with and not stopped, as running.
  std::vector<Command> report(MachineId m, uint64_t now) {
    std::map<std::string, TaskState> r;
    for (const auto& [id, t] : sched_.tasks())
      if (t.machine == m && (t.state == TaskState::kStarting || t.state == TaskState::kRunning))
        r[id] = TaskState::kReady;
    return sched_.report(m, r, now);
  }
  Allocator alloc_;
  Scheduler sched_{alloc_};
  std::vector<MachineId> ids_;
};

TEST_F(Fence, AFencedEntitlementIsLeftAloneAndOthersAreNot) {
  ASSERT_TRUE(sched_.create(spec("a", 1, 2), 0).ok());
  ASSERT_TRUE(sched_.create(spec("b", 2, 2), 0).ok());
  for (MachineId m : ids_) report(m, 1);
  sched_.handover().fence(1, true);
  // Calls on its jobs are refused, saying why; another entitlement's go on.
  auto scale = sched_.scale("a", 1, 2);
  ASSERT_FALSE(scale.ok());
  EXPECT_EQ(scale.error().code, rpc::kUnavailable);
  EXPECT_FALSE(sched_.stop("a", 2).ok());
  EXPECT_FALSE(sched_.create(spec("c", 1, 1), 2).ok());
  EXPECT_TRUE(sched_.scale("b", 1, 2).ok());
  // Its machines' silence, death and drains change nothing, and send nothing.
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(sched_.report(ids_[i], {}, 600'000'000).empty());
    EXPECT_TRUE(sched_.replacement().machine_down(ids_[i], 3).empty());
    EXPECT_TRUE(sched_.moves().machine_drain(ids_[i], 3).empty());
  }
  EXPECT_TRUE(sched_.tick(4).empty());
  int running = 0;
  for (const auto& t : sched_.tasks().of_job("a")) running += t.state == TaskState::kRunning;
  EXPECT_EQ(running, 2);
  // Unfenced (the move rolled back): a machine that died meanwhile is acted on now.
  sched_.handover().fence(1, false);
  auto moved = sched_.replacement().machine_down(ids_[0], 5);
  EXPECT_EQ(moved.size(), 1u);
}

TEST(ProfileRollMove, HeldWhileFencedAndGoesOnWhereItWasWhenTakenIn) {
  Allocator alloc;
  Broker broker{alloc};
  std::vector<MachineId> ids;
  for (int d = 0; d < 2; ++d) {
    MachineInfo info{"m" + std::to_string(d), "dc1", "rack" + std::to_string(d), "a", {4000, 8192}};
    auto id = broker.register_machine(info, 0);
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(broker.health(info.id, "ok", 0).ok());
    ids.push_back(*id);
  }
  broker.entitlements().restore(1, EntitlementSpec{"web", 2, "new", "", {}, {}});
  for (MachineId m : ids) ASSERT_TRUE(alloc.assign(m, 1).ok());
  Notes notes;
  ProfileRolls rolls{alloc, broker, notes};
  rolls.start(1, "old", 1);
  auto first = rolls.advance();
  ASSERT_EQ(first.size(), 1u);  // one machine at a time
  rolls.fence(1, true);
  ASSERT_TRUE(broker.profile_applied(alloc.spec(*first.begin()).name, "new").ok());
  EXPECT_TRUE(rolls.advance().empty()) << "fenced: the roll waits";
  auto name = [&alloc](MachineId m) { return alloc.spec(m).name; };
  auto moved = rolls.moved(1, name);
  ASSERT_TRUE(moved.has_value());
  ASSERT_EQ(moved->applying.size(), 1u);
  ASSERT_EQ(moved->waiting.size(), 1u);
  // Taken in by another ProfileRolls (a shard with the same machines): the one waiting
  // is held at the old profile, and the roll goes on from there.
  rolls.forget(1);
  ProfileRolls there{alloc, broker, notes};
  there.adopt(1, *moved, [&alloc](const std::string& n) -> std::optional<MachineId> {
    for (MachineId m = 0; m < alloc.machine_count(); ++m)
      if (alloc.spec(m).name == n) return m;
    return std::nullopt;
  });
  ASSERT_TRUE(there.rolling(1));
  MachineId waiting = *first.begin() == ids[0] ? ids[1] : ids[0];
  EXPECT_TRUE(broker.profile_held(waiting));
  EXPECT_EQ(there.advance(), std::set<MachineId>{waiting})
      << "the applied one done, the next released";
}

TEST_F(Fence, AJobHandedOverCarriesOnWhereItWasWithNothingStarted) {
  ASSERT_TRUE(sched_.create(spec("a", 1, 2), 0).ok());
  for (MachineId m : ids_) report(m, 1);
  auto moved = sched_.handover().moved_job("a");
  ASSERT_TRUE(moved.has_value());
  std::vector<TaskRecord> tasks = sched_.tasks().of_job("a");
  auto request = alloc_.request("a");
  auto placement = alloc_.placement("a");
  sched_.handover().forget_job("a");
  EXPECT_FALSE(sched_.job("a").has_value());
  EXPECT_TRUE(sched_.tasks().of_job("a").empty());
  // Taken in again (as another shard would, its ids being the same here): no command,
  // the tasks as they were.
  ASSERT_TRUE(alloc_.restore(*request, placement).ok());
  sched_.handover().adopt_job(*moved, tasks);
  EXPECT_EQ(sched_.tasks().of_job("a").size(), 2u);
  for (MachineId m : ids_) EXPECT_TRUE(report(m, 2).empty());
  EXPECT_TRUE(sched_.tick(3).empty());
}

}  // namespace
}  // namespace weft::cp
