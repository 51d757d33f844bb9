// The scheduler's unit tests' fixture (scheduler_test.cc, batch_test.cc): `machines`
// machines, each on a rack of its own, in entitlement 1, and a scheduler with the given
// limits; whatever a test did, the counts by state (what /metrics shows) must match the
// tasks at its end.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

class SchedulerFixture : public ::testing::Test {
 protected:
  SchedulerFixture(int machines, SchedulerLimits limits)
      : machines_(machines), sched_(alloc_, limits) {}
  void SetUp() override {
    for (int d = 0; d < machines_; ++d)
      ids_.push_back(alloc_.add_machine(
          {"m" + std::to_string(d), "dc1", "rack" + std::to_string(d), "a", {4000, 8192}}));
    for (MachineId m : ids_) ASSERT_TRUE(alloc_.assign(m, 1).ok());
  }
  void TearDown() override {
    std::map<TaskState, size_t> walked;
    for (const auto& [id, t] : sched_.tasks()) ++walked[t.state];
    for (TaskState s : kAllTaskStates)
      EXPECT_EQ(sched_.tasks().count_in(s), walked[s]) << task_state_name(s);
  }

  int machines_;
  Allocator alloc_;
  Scheduler sched_;
  std::vector<MachineId> ids_;
};

}  // namespace weft::cp
