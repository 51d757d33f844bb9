#include "common/cron.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

// 2026-11-28 00:00:00 UTC (a Saturday).
constexpr int64_t kSat = 1795824000;

int64_t next(const char* schedule, int64_t after) {
  auto c = parse_cron(schedule);
  EXPECT_TRUE(c.ok()) << schedule << ": " << (c.ok() ? "" : c.error().str());
  if (!c.ok()) return -1;
  auto n = c->next_after(after);
  EXPECT_TRUE(n.has_value()) << schedule;
  return n.value_or(-1);
}

TEST(Cron, FiveFieldsRunOnTheMinute) {
  EXPECT_EQ(next("*/15 * * * *", kSat), kSat + 15 * 60);
  EXPECT_EQ(next("*/15 * * * *", kSat - 1), kSat);
  EXPECT_EQ(next("30 2 * * *", kSat), kSat + 2 * 3600 + 30 * 60);
  EXPECT_EQ(next("0 0 * * MON", kSat), kSat + 2 * 86400);  // Monday the 30th
  EXPECT_EQ(next("0 0 1 dec *", kSat), kSat + 3 * 86400);  // 1 December
  EXPECT_EQ(next("@hourly", kSat + 1), kSat + 3600);
  EXPECT_EQ(next("@daily", kSat), kSat + 86400);
  EXPECT_EQ(next("@weekly", kSat), kSat + 86400);                 // Sunday
  EXPECT_EQ(next("0 12 * * 7", kSat), kSat + 86400 + 12 * 3600);  // 7 is Sunday
  EXPECT_EQ(next("0 0 1 1 *", kSat), 1798761600);                 // 2027-01-01
}

TEST(Cron, SixFieldsHaveSecondsFirst) {
  EXPECT_EQ(next("*/5 * * * * *", kSat), kSat + 5);
  EXPECT_EQ(next("*/5 * * * * *", kSat + 3), kSat + 5);
  EXPECT_EQ(next("10-12 * * * * *", kSat + 11), kSat + 12);
  EXPECT_EQ(next("10-12 * * * * *", kSat + 12), kSat + 60 + 10);
  EXPECT_EQ(next("0,30 * * * * *", kSat), kSat + 30);
  EXPECT_EQ(next("50/5 * * * * *", kSat + 56), kSat + 60 + 50);
}

TEST(Cron, EitherRestrictedDayMatches) {
  // The 1st of the month or any Monday: Monday 30 November comes first.
  EXPECT_EQ(next("0 0 1 * 1", kSat), kSat + 2 * 86400);
  // Day 29 and a weekday of any: the 29th.
  EXPECT_EQ(next("0 0 29 * *", kSat), kSat + 86400);
}

TEST(Cron, TheShortestGapBetweenTwoTimesItNames) {
  auto gap = [](const char* text) {
    auto c = parse_cron(text);
    EXPECT_TRUE(c.ok()) << text;
    return c.ok() ? c->shortest_gap() : -1;
  };
  EXPECT_EQ(gap("* * * * * *"), 1);
  EXPECT_EQ(gap("*/2 * * * * *"), 2);
  EXPECT_EQ(gap("0,1 3 * * * *"), 1);       // twice a day, a second apart
  EXPECT_EQ(gap("59 59 23 * * *"), 86400);  // once a day
  EXPECT_EQ(gap("*/15 * * * *"), 900);
  EXPECT_EQ(gap("58,2 * * * * *"), 4);  // across the minute
  EXPECT_EQ(gap("@daily"), 86400);
}

TEST(Cron, BadSchedulesNameTheField) {
  struct Bad {
    const char* text;
    const char* says;
  } cases[] = {
      {"", "five fields"},
      {"* * * *", "five fields"},
      {"* * * * * * *", "five fields"},
      {"61 * * * *", "minute: 61 is out of range 0-59"},
      {"* 24 * * *", "hour: 24"},
      {"* * 0 * *", "day-of-month: 0"},
      {"* * * 13 *", "month: 13"},
      {"* * * * 8", "day-of-week: 8"},
      {"*/0 * * * *", "minute: a step"},
      {"5-1 * * * *", "runs backwards"},
      {"x * * * *", "minute: 'x' is not a number"},
      {"* * * foo *", "month: 'foo'"},
      {"0 0 30 2 *", "names no date"},
      {"@sometimes", "is not one of"},
      {"1,,2 * * * *", "minute: '' is not a number"},
  };
  for (const auto& c : cases) {
    auto r = parse_cron(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.error().message.find(c.says), std::string::npos)
        << c.text << ": " << r.error().message;
  }
}

TEST(Cron, SparseSchedulesAreFoundAndLeapDaysToo) {
  // 29 February: 2028.
  EXPECT_EQ(next("0 0 29 2 *", kSat), 1835395200);
  auto c = parse_cron("0 0 29 2 *");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->next_after(-5).has_value());
}

}  // namespace
}  // namespace weft
