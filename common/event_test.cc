#include "common/event.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(EventLoop, DeferOnceCoalescesTheCallsOfAnIterationIntoOneRun) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  Source slot;
  int runs = 0, first = 0, second = 0;
  (*loop)->defer_once(slot, [&] {
    ++runs;
    ++first;
  });
  (*loop)->defer_once(slot, [&] { ++second; });  // coalesced into the pending run
  EXPECT_TRUE(slot.active());
  EXPECT_EQ(runs, 0);  // not before the next iteration
  for (int i = 0; i < 10 && runs == 0; ++i) ASSERT_TRUE((*loop)->run_once(10'000).ok());
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 0);
  EXPECT_FALSE(slot.active());
  // Once it ran, the next call makes a new run.
  (*loop)->defer_once(slot, [&] { ++runs; });
  for (int i = 0; i < 10 && runs == 1; ++i) ASSERT_TRUE((*loop)->run_once(10'000).ok());
  EXPECT_EQ(runs, 2);
}

}  // namespace
}  // namespace weft
