#include "agent/machine_lease.h"

#include <gtest/gtest.h>

namespace weft::agent {
namespace {

using json = nlohmann::json;

MachineLease granted(uint64_t lease_ms, uint64_t fence_ms) {
  MachineLease l;
  EXPECT_TRUE(
      l.set_terms(json{{"lease", {{"duration_ms", lease_ms}, {"fence_after_ms", fence_ms}}}}).ok());
  return l;
}

TEST(MachineLease, NoTermsFromAnOlderControlPlaneFenceNothing) {
  MachineLease l;
  EXPECT_TRUE(l.set_terms(json{{"machine", "m1"}}).ok());
  l.renewed(1'000'000);
  EXPECT_FALSE(l.has_terms());
  EXPECT_FALSE(l.fenced(UINT64_MAX));
}

TEST(MachineLease, HostileTermsAreRefusedWithTheField) {
  MachineLease l;
  for (const json& bad :
       {json{{"lease", "8s"}}, json{{"lease", {{"duration_ms", -1}, {"fence_after_ms", 1}}}},
        json{{"lease", {{"duration_ms", 8000}, {"fence_after_ms", 8000}}}},
        json{{"lease", {{"duration_ms", 8000}}}},
        json{{"lease", {{"duration_ms", 600001}, {"fence_after_ms", 1}}}},
        json{{"lease", {{"duration_ms", 8000.5}, {"fence_after_ms", 4000}}}}}) {
    auto s = l.set_terms(bad);
    ASSERT_FALSE(s.ok()) << bad.dump();
    EXPECT_NE(s.error().field.find("lease."), std::string::npos) << s.error().str();
  }
  EXPECT_FALSE(l.has_terms());  // nothing half-applied
}

TEST(MachineLease, CountsFromTheLatestSendThatWasAnswered) {
  MachineLease l = granted(8000, 4000);
  l.renewed(10'000'000);
  l.renewed(9'000'000);  // an older call's answer, arriving late: no step back
  EXPECT_EQ(l.renewed_from(), 10'000'000u);
  EXPECT_EQ(l.fence_at(), 14'000'000u);
  EXPECT_EQ(l.ends_at(), 18'000'000u);
  EXPECT_FALSE(l.fenced(13'999'999));
  EXPECT_TRUE(l.fenced(14'000'000));
}

TEST(MachineLease, AFencedTaskIsKilledASecondBeforeTheLeaseEnds) {
  MachineLease l = granted(8000, 4000);
  l.renewed(10'000'000);
  // Fenced on time: 3 s of its 10 s grace are left before the kill.
  EXPECT_EQ(l.fenced_grace(10'000'000, 14'000'000), 3'000'000u);
  // A short grace is its own.
  EXPECT_EQ(l.fenced_grace(500'000, 14'000'000), 500'000u);
  // The timer fired late (or the agent restarted): what is left, then nothing.
  EXPECT_EQ(l.fenced_grace(10'000'000, 16'500'000), 500'000u);
  EXPECT_EQ(l.fenced_grace(10'000'000, 17'000'000), 0u);
  EXPECT_EQ(l.fenced_grace(10'000'000, 30'000'000), 0u);
}

TEST(MachineLease, KeptForThisBootOnly) {
  MachineLease l = granted(8000, 4000);
  l.renewed(123'456'789);
  std::string text = l.to_text("boot-a");
  auto back = MachineLease::from_text(text, "boot-a");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->renewed_from(), 123'456'789u);
  EXPECT_EQ(back->lease_us(), 8'000'000u);
  EXPECT_EQ(back->fence_after_us(), 4'000'000u);
  EXPECT_FALSE(MachineLease::from_text(text, "boot-b"));  // the machine restarted
  EXPECT_FALSE(MachineLease::from_text(text, ""));
  for (const char* bad : {"", "boot-a", "boot-a 1 2", "boot-a x 8000000 4000000",
                          "boot-a 1 8000000 9000000", "boot-a 1 0 0", "boot-a -1 8000000 4000000",
                          "boot-a 1 8000000 4000000 5", "boot-a 1 800000000000 4000000"})
    EXPECT_FALSE(MachineLease::from_text(bad, "boot-a")) << bad;
}

}  // namespace
}  // namespace weft::agent
