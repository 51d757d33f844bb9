#include "agent/range_pool.h"

#include <gtest/gtest.h>

namespace weft::agent {
namespace {

TEST(RangePool, HandsOutInTurnAndAFreedNumberLast) {
  RangePool pool(10, 13);
  EXPECT_EQ(pool.take("a"), 10u);
  EXPECT_EQ(pool.take("b"), 11u);
  EXPECT_EQ(pool.take("a"), 10u);  // what it holds
  pool.release("a");
  EXPECT_EQ(pool.take("c"), 12u);  // 10 was just freed: the others first
  EXPECT_EQ(pool.take("d"), 13u);
  EXPECT_EQ(pool.take("e"), 10u);  // wrapped round
  EXPECT_EQ(pool.take("f"), std::nullopt);
  EXPECT_EQ(pool.next_free(), std::nullopt);
  EXPECT_EQ(pool.held(), 4u);
}

TEST(RangePool, NextFreeHoldsNothingUntilHold) {
  RangePool pool(1, 3);
  auto n = pool.next_free();
  ASSERT_EQ(n, 1u);
  EXPECT_FALSE(pool.in_use(1));
  EXPECT_EQ(pool.next_free(), 1u);  // unchanged: nothing was held
  ASSERT_TRUE(pool.hold(*n, "a"));
  EXPECT_EQ(pool.next_free(), 2u);
}

TEST(RangePool, ARestartHoldsWhatOwnersHadAndRefusesWhatCannotBe) {
  RangePool pool(100, 199);
  EXPECT_TRUE(pool.hold(150, "a"));
  EXPECT_TRUE(pool.hold(150, "a"));   // again: the same
  EXPECT_FALSE(pool.hold(150, "b"));  // another's
  EXPECT_FALSE(pool.hold(151, "a"));  // it holds one already
  EXPECT_FALSE(pool.hold(99, "c"));   // outside the range
  EXPECT_FALSE(pool.hold(200, "c"));
  EXPECT_EQ(pool.take("d"), 151u);  // after the highest held
}

TEST(RangePool, AnEmptyRangeHasNothing) {
  RangePool pool(5, 4);
  EXPECT_TRUE(pool.empty_range());
  EXPECT_EQ(pool.take("a"), std::nullopt);
}

}  // namespace
}  // namespace weft::agent
