// Autoscaling's decision rules (controlplane/tend/autoscaler.h): the proportional rule and its
// tolerance, the stabilisation windows, the rate limits, min/max/quota, and the
// prediction on a synthetic daily and weekly pattern.
#include "controlplane/tend/autoscaler.h"
#include "controlplane/tend/week_load.h"

#include <gtest/gtest.h>

#include <cmath>

namespace weft::cp {
namespace {

constexpr uint64_t kSec = 1'000'000;
constexpr uint64_t kMin = 60 * kSec;
constexpr uint64_t kHour = 60 * kMin;
constexpr uint64_t kDay = 24 * kHour;

AutoscalePolicy policy(int64_t min, int64_t max, double target) {
  AutoscalePolicy p;
  p.min = min;
  p.max = max;
  p.target = target;
  return p;
}

TEST(Autoscale, ALoadWithinTheToleranceChangesNothing) {
  Autoscaler a(policy(1, 100, 0.5));
  a.observe(10 * kSec, 10 * 0.54, 10);  // 8% over the target
  auto d = a.decide(10 * kSec, 10, 100);
  EXPECT_EQ(d.desired, 10) << d.reason;
  a.observe(20 * kSec, 10 * 0.46, 10);  // 8% under
  EXPECT_EQ(a.decide(20 * kSec, 10, 100).desired, 10);
  a.observe(30 * kSec, 10 * 0.75, 10);  // 50% over: ceil(7.5 / 0.5)
  d = a.decide(30 * kSec, 10, 100);
  EXPECT_EQ(d.desired, 15) << d.reason;
  EXPECT_EQ(d.proportional, 15);
  EXPECT_NE(d.reason.find("load 0.75 a task against a target of 0.5 (10 ready): 10 -> 15"),
            std::string::npos)
      << d.reason;
}

TEST(Autoscale, WithoutALoadNothingChanges) {
  Autoscaler a(policy(2, 10, 0.5));
  auto d = a.decide(kSec, 4, 10);
  EXPECT_EQ(d.desired, 4);
  EXPECT_NE(d.reason.find("no load reported yet"), std::string::npos);
  a.observe(2 * kSec, 3.0, 0);  // no ready task: no figure
  EXPECT_EQ(a.decide(2 * kSec, 4, 10).desired, 4);
}

TEST(Autoscale, ItGrowsAtOnceAndShrinksOnlyAfterTheDownWindow) {
  Autoscaler a(policy(1, 100, 1.0));
  uint64_t t = 0;
  a.observe(t, 20, 10);  // twice the target
  int64_t size = a.decide(t, 10, 100).desired;
  EXPECT_EQ(size, 20);
  a.changed(t, 10, size);
  // The load falls to half the target: nothing for five minutes, then down.
  for (t = 30 * kSec; t < 5 * kMin; t += 30 * kSec) {
    a.observe(t, 10, size);
    auto d = a.decide(t, size, 100);
    EXPECT_EQ(d.desired, size) << "at " << t / kSec << " s: " << d.reason;
    EXPECT_NE(d.reason.find("scale-down window (5m)"), std::string::npos) << d.reason;
  }
  t = 5 * kMin + 31 * kSec;
  a.observe(t, 10, size);
  auto d = a.decide(t, size, 100);
  EXPECT_EQ(d.desired, 10) << d.reason;
}

TEST(Autoscale, AnUpWindowTakesTheLowestRecommendationOfIt) {
  AutoscalePolicy p = policy(1, 100, 1.0);
  p.up_window_us = 60 * kSec;
  p.up_step = 100;  // no rate limit here
  Autoscaler a(p);
  a.observe(0, 10, 10);
  EXPECT_EQ(a.decide(0, 10, 100).desired, 10);
  a.observe(10 * kSec, 30, 10);  // a spike: held by the window
  auto d = a.decide(10 * kSec, 10, 100);
  EXPECT_EQ(d.desired, 10) << d.reason;
  EXPECT_NE(d.reason.find("scale-up window (1m)"), std::string::npos) << d.reason;
  for (uint64_t t = 20 * kSec; t <= 80 * kSec; t += 10 * kSec) {
    a.observe(t, 30, 10);
    d = a.decide(t, 10, 100);
  }
  EXPECT_EQ(d.desired, 30) << d.reason;  // sustained for the whole window
}

TEST(Autoscale, RateLimitsBoundEachPeriod) {
  Autoscaler a(policy(1, 1000, 1.0));
  a.observe(0, 100, 2);  // asks for 100
  auto d = a.decide(0, 2, 1000);
  EXPECT_EQ(d.desired, 6) << d.reason;  // max(4 tasks, 100% of 2)
  EXPECT_NE(d.reason.find("limited by the scale-up rate (15s)"), std::string::npos) << d.reason;
  a.changed(0, 2, 6);
  a.observe(5 * kSec, 100, 6);
  EXPECT_EQ(a.decide(5 * kSec, 6, 1000).desired, 6);  // the period's budget is spent
  a.observe(16 * kSec, 100, 6);
  EXPECT_EQ(a.decide(16 * kSec, 6, 1000).desired, 12);  // a new period: 100% of 6
  // Down: at most the fraction of the job a period.
  AutoscalePolicy p = policy(1, 1000, 1.0);
  p.down_window_us = 0;
  p.down_fraction = 0.25;
  Autoscaler b(p);
  b.observe(0, 1, 40);
  EXPECT_EQ(b.decide(0, 40, 1000).desired, 30);
}

TEST(Autoscale, NeverBelowMinNorAboveMaxOrTheQuota) {
  Autoscaler a(policy(3, 8, 1.0));
  a.observe(0, 20, 5);
  auto d = a.decide(0, 5, 100);
  EXPECT_EQ(d.desired, 8);
  EXPECT_NE(d.reason.find("at max 8"), std::string::npos) << d.reason;
  d = a.decide(0, 5, 6);  // the quota leaves room for 6
  EXPECT_EQ(d.desired, 6);
  EXPECT_NE(d.reason.find("what the entitlement's quota leaves"), std::string::npos) << d.reason;
  AutoscalePolicy p = policy(3, 8, 1.0);
  p.down_window_us = 0;
  Autoscaler b(p);
  b.observe(0, 0.1, 5);
  d = b.decide(0, 5, 100);
  EXPECT_EQ(d.desired, 3);
  EXPECT_NE(d.reason.find("at min 3"), std::string::npos) << d.reason;
  EXPECT_EQ(b.decide(0, 5, 2).desired, 2);  // the quota wins over min
}

// A load that swings ±8% around the target never moves the job; a load that steps up and
// down every minute changes direction at most once per 5-minute window.
TEST(Autoscale, NoOscillation) {
  Autoscaler a(policy(1, 100, 1.0));
  int64_t size = 20;
  for (int i = 0; i < 200; ++i) {
    uint64_t t = static_cast<uint64_t>(i) * 15 * kSec;
    a.observe(t, size * (1 + 0.08 * std::sin(i)), size);
    auto d = a.decide(t, size, 100);
    ASSERT_EQ(d.desired, size) << d.reason;
  }
  Autoscaler b(policy(1, 100, 1.0));
  size = 20;
  int direction = 0, changes_of_direction = 0;
  uint64_t last_change_of_direction = 0;
  for (int i = 0; i < 240; ++i) {
    uint64_t t = static_cast<uint64_t>(i) * 15 * kSec;
    double load = (i / 4) % 2 ? 30 : 14;  // a square wave of a minute each way
    b.observe(t, load, size);
    auto d = b.decide(t, size, 100);
    if (d.desired != size) {
      int dir = d.desired > size ? 1 : -1;
      if (direction != 0 && dir != direction) {
        if (changes_of_direction > 0) {
          EXPECT_GE(t - last_change_of_direction, 5 * kMin) << "at " << t / kSec << " s";
        }
        ++changes_of_direction;
        last_change_of_direction = t;
      }
      direction = dir;
      b.changed(t, size, d.desired);
      size = d.desired;
    }
  }
  // It settles within the tolerance of the peak's size (30 / 28 is 7% over the target): a
  // minute's dip does not shrink it.
  EXPECT_GE(size, 28);
  EXPECT_LE(size, 30);
  EXPECT_LE(changes_of_direction, 1);
}

// A diurnal load with weekday/weekend shape (controlplane/tend/week_load.h): after a week
// and a day of history the forecast grows the job before the morning peak, where the
// proportional rule alone grows it only once the load is there.

TEST(Autoscale, TheForecastGrowsTheJobBeforeTheMorningPeak) {
  AutoscalePolicy p = policy(1, 100, 1.0);
  p.predictive = true;
  p.lead_us = 30 * kMin;
  Autoscaler pred(p);
  Autoscaler plain(policy(1, 100, 1.0));
  EXPECT_FALSE(pred.predict(kDay).has_value());
  // Eight days of history, one sample a minute.
  uint64_t t = 0;
  for (; t < 8 * kDay; t += kMin) {
    pred.observe(t, weekly_load(t), 10);
    plain.observe(t, weekly_load(t), 10);
  }
  EXPECT_LE(pred.slots_kept(), static_cast<size_t>(p.history_days) * 288);
  // Day 8 is a Tuesday (day 1 of the second week); at 7:40 the load is still the night's.
  uint64_t at = 8 * kDay + 7 * kHour + 40 * kMin;
  for (; t <= at; t += kMin) {
    pred.observe(t, weekly_load(t), 10);
    plain.observe(t, weekly_load(t), 10);
  }
  auto f = pred.predict(at + 30 * kMin);  // 8:10: the ramp has begun
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(*f, weekly_load(at + 30 * kMin), 2.0);
  auto dp = pred.decide(at, 5, 100);
  auto dr = plain.decide(at, 5, 100);
  EXPECT_EQ(dr.desired, 5) << dr.reason;  // the night's load: nothing to do yet
  EXPECT_GT(dp.desired, 5) << dp.reason;  // the forecast asks for more, ahead of it
  ASSERT_TRUE(dp.predicted.has_value());
  EXPECT_NE(dp.reason.find("predicted in the next 30m"), std::string::npos) << dp.reason;
  // A weekend day is forecast from the weekend a week before, not from Friday.
  uint64_t saturday_noon = 12 * kDay + 12 * kHour;
  for (; t < saturday_noon; t += kMin) pred.observe(t, weekly_load(t), 10);
  auto sat = pred.predict(saturday_noon + 15 * kMin);
  ASSERT_TRUE(sat.has_value());
  EXPECT_NEAR(*sat, 10, 1.0);
}

TEST(Autoscale, TheForecastFollowsAServiceThatGrew) {
  AutoscalePolicy p = policy(1, 1000, 1.0);
  p.predictive = true;
  Autoscaler a(p);
  uint64_t t = 0;
  for (; t < 8 * kDay; t += kMin) a.observe(t, weekly_load(t), 10);
  // The last hour ran at twice the level of the same hour a week ago.
  for (uint64_t end = t + kHour; t < end; t += kMin) a.observe(t, 2 * weekly_load(t), 10);
  auto f = a.predict(t + 10 * kMin);
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(*f, 2 * weekly_load(t + 10 * kMin), 2.0);
}

// With a forecast, the job shrinks once the load now and the load coming both allow it,
// not a whole down window later: fewer task-hours after the evening's fall.
TEST(Autoscale, TheForecastLetsTheJobShrinkWhenTheLoadComingAgrees) {
  AutoscalePolicy p = policy(1, 100, 1.0);
  p.predictive = true;
  Autoscaler a(p);
  uint64_t t = 0;
  for (; t < 8 * kDay + 18 * kHour + 30 * kMin; t += kMin) a.observe(t, weekly_load(t), 30);
  auto d = a.decide(t, 30, 100);  // 18:30 on a weekday: the night's load, now and to come
  EXPECT_LT(d.desired, 30) << d.reason;
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// A scaler rebuilt from its notes (a new leader's) decides as the old one would have:
// the down window still holds a scale-down, the rate limit still counts the last step,
// and the week of history still predicts the morning peak.
TEST(Autoscale, AScalerRebuiltFromItsNotesDecidesAsTheOldOne) {
  constexpr uint64_t kS = 1'000'000, kM = 60 * kS;
  AutoscalePolicy p;
  p.min = 1;
  p.max = 100;
  p.target = 1.0;
  p.up_step = 4;
  p.up_fraction = 0;
  p.predictive = true;
  Autoscaler old(p);
  // A week and a day of the synthetic load, one sample a minute, then a step up.
  const uint64_t start = Autoscaler::kDayUs * 7 * 100;  // a Monday: day 0 of a week
  uint64_t t = start;
  for (; t < start + 8 * Autoscaler::kDayUs; t += kM) old.observe(t, weekly_load(t), 10);
  t = start + 8 * Autoscaler::kDayUs + 2 * 3600 * kS;  // Tuesday 2:00, the night's load
  old.observe(t, 20, 10);
  int64_t size = old.decide(t, 10, 100).desired;
  EXPECT_EQ(size, 14) << "4 a rate period at most";
  old.changed(t, 10, size);
  auto same = [&](Autoscaler& a, Autoscaler& b, uint64_t at, int64_t current) {
    auto da = a.decide(at, current, 100), db = b.decide(at, current, 100);
    EXPECT_EQ(da.desired, db.desired) << da.reason << " | " << db.reason;
    EXPECT_EQ(da.predicted.has_value(), db.predicted.has_value());
    return da.desired;
  };
  // Round-trip through JSON text, as the store keeps it.
  Autoscaler rebuilt(p);
  rebuilt.restore(nlohmann::json::parse(old.recent_json().dump()),
                  nlohmann::json::parse(old.history_json().dump()));
  EXPECT_EQ(rebuilt.slots_kept(), old.slots_kept());
  EXPECT_EQ(rebuilt.newest_slot(), old.newest_slot());
  // Within the rate period: no more steps, in either.
  EXPECT_EQ(same(old, rebuilt, t + 5 * kS, size), size);
  // The load falls: held by the down window in both (a fresh scaler would shrink at once).
  Autoscaler fresh(p);
  old.observe(t + 60 * kS, 5, size);
  rebuilt.observe(t + 60 * kS, 5, size);
  fresh.observe(t + 60 * kS, 5, size);
  EXPECT_EQ(same(old, rebuilt, t + 60 * kS, size), size) << "held by the down window";
  EXPECT_LT(fresh.decide(t + 60 * kS, size, 100).desired, size) << "what was lost before";
  // The same forecast of Tuesday's 8:00 peak.
  const uint64_t peak = start + 8 * Autoscaler::kDayUs + 9 * 3600 * kS;
  ASSERT_TRUE(old.predict(peak).has_value());
  EXPECT_NEAR(*rebuilt.predict(peak), *old.predict(peak), 1e-3);
  // Notes that are not this scaler's are left out, not trusted.
  Autoscaler hostile(p);
  hostile.restore(
      nlohmann::json{{"last", {-1, 2}}, {"recommendations", {{1, 2}, {"x", 3}, {0, 1}}}},
      nlohmann::json{{"slots", {{5, 1, 2.0}, {4, 1, 1.0}, {6, 1, "nan"}, {1e20, 1, 1}}}});
  EXPECT_EQ(hostile.slots_kept(), 1u);
  EXPECT_FALSE(hostile.predict(peak).has_value());
}

}  // namespace
}  // namespace weft::cp
