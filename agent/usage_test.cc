#include "agent/usage.h"

#include <gtest/gtest.h>

namespace weft::agent {
namespace {

TEST(Usage, RatesOverTheIntervalAndMemoryNow) {
  std::map<std::string, UsageCounters> now;
  UsageSampler s(
      5'000'000,
      [&](const std::string& id) -> std::optional<UsageCounters> {
        auto it = now.find(id);
        if (it == now.end()) return std::nullopt;
        return it->second;
      },
      [&] {
        std::vector<std::string> ids;
        for (const auto& [id, c] : now) ids.push_back(id);
        return ids;
      });
  now["a"] = UsageCounters{1'000'000, 100, 0, 0};
  now["b"] = UsageCounters{0, 7, 0, 0};
  s.sample(10'000'000);
  EXPECT_TRUE(s.report({}).tasks.empty());  // one sample: no rate yet
  // 2.5 s of CPU in 5 s: half a core; 10 MB read and 5 MB written in 5 s.
  now["a"] = UsageCounters{3'500'000, 200, 10'000'000, 5'000'000};
  now["b"] = UsageCounters{5'000'000, 9, 0, 0};
  s.sample(15'000'000);
  UsageReport r = s.report({});
  EXPECT_EQ(r.interval_ms, 5000u);
  ASSERT_EQ(r.tasks.size(), 2u);
  EXPECT_EQ(r.tasks["a"], (TaskUsage{500, 200, 2'000'000, 1'000'000}));
  EXPECT_EQ(r.tasks["b"].cpu_milli, 1000u);
  EXPECT_EQ(s.report({"b", "gone"}).tasks.size(), 1u);
  // A task gone is forgotten; a counter that went back counts from zero.
  now.erase("b");
  now["a"] = UsageCounters{250'000, 300, 0, 0};
  s.sample(20'000'000);
  r = s.report({});
  ASSERT_EQ(r.tasks.size(), 1u);
  EXPECT_EQ(r.tasks["a"].cpu_milli, 50u);
  EXPECT_EQ(r.tasks["a"].io_read_bps, 0u);
}

TEST(Usage, IoStatIsSummedOverDevices) {
  auto [r, w] = io_stat_bytes(
      "8:0 rbytes=1000 wbytes=20 rios=1 wios=2 dbytes=0 dios=0\n"
      "259:0 rbytes=24 wbytes=3 rios=1 wios=1 dbytes=0 dios=0\n");
  EXPECT_EQ(r, 1024u);
  EXPECT_EQ(w, 23u);
  EXPECT_EQ(io_stat_bytes("").first, 0u);
  EXPECT_EQ(io_stat_bytes("garbage rbytes=x\n").first, 0u);
}

}  // namespace
}  // namespace weft::agent
