#include "common/clock.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(WallClockSteps, StepsEitherWayAreSeenAndSlewsAreNot) {
  WallClockSteps steps;
  const uint64_t wall = 1'795'824'000'000'000;   // 2026-11-28, in µs
  EXPECT_EQ(steps.observe(1'000'000, wall), 0);  // the first reading: nothing to compare
  // A quarter second later on both clocks, and a slew of 2 ms: no step.
  EXPECT_EQ(steps.observe(1'250'000, wall + 252'000), 0);
  // An hour forward between two readings.
  EXPECT_EQ(steps.observe(1'500'000, wall + 500'000 + 3'600'000'000), 3'600'000'000 - 2'000);
  EXPECT_EQ(steps.observe(1'750'000, wall + 750'000 + 3'600'000'000), 0);  // measured anew
  // Back by ten minutes.
  EXPECT_EQ(steps.observe(2'000'000, wall + 1'000'000 + 3'000'000'000), -600'000'000);
  // Slews that add up over many readings are no step either.
  uint64_t mono = 2'000'000, w = wall + 1'000'000 + 3'000'000'000;
  for (int i = 0; i < 10'000; ++i) {
    mono += 250'000;
    w += 250'100;  // 400 ppm fast
    EXPECT_EQ(steps.observe(mono, w), 0);
  }
}

}  // namespace
}  // namespace weft
