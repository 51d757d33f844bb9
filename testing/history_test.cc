#include "testing/history.h"

#include <gtest/gtest.h>

namespace weft::testing {
namespace {

History::Final final_state(std::map<std::string, int> running) {
  History::Final f;
  for (const auto& [job, n] : running) f.exists[job] = true;
  f.running = std::move(running);
  return f;
}

History two_copies(uint64_t first_ends, uint64_t second_begins) {
  History h;
  h.at_most_one("db");
  h.call({0, "create", "db", 1, true});
  h.copy({"db", "db.0.1", "m0", 0, 10, first_ends});
  h.copy({"db", "db.0.2", "m1", 0, second_begins, 0});
  return h;
}

TEST(History, AnAtMostOneIndexThatMovedInTurnIsSound) {
  History h = two_copies(100, 101);
  EXPECT_TRUE(h.check(final_state({{"db", 1}})).empty()) << h.dump();
}

TEST(History, TwoCopiesAtOneInstantAreFound) {
  for (auto [ends, begins] : {std::pair<uint64_t, uint64_t>{100, 100}, {200, 100}, {0, 100}}) {
    History h = two_copies(ends, begins);
    auto bad = h.check(final_state({{"db", 1}}));
    ASSERT_EQ(bad.size(), 1u) << h.dump();
    EXPECT_NE(bad[0].find("two copies of db index 0"), std::string::npos) << bad[0];
  }
}

TEST(History, OverlapsOfAJobThatMayHaveManyCopiesAreNotViolations) {
  History h;
  h.call({0, "create", "web", 1, true});
  h.copy({"web", "web.0.1", "m0", 0, 10, 0});
  h.copy({"web", "web.0.2", "m1", 0, 20, 0});
  EXPECT_TRUE(h.check(final_state({{"web", 1}})).empty());
}

TEST(History, AnAcknowledgedChangeMissingAfterHealingIsFound) {
  History h;
  h.call({0, "create", "a", 2, true});
  h.call({1, "create", "b", 1, true});
  h.call({2, "scale", "a", 3, true});
  h.call({3, "scale", "b", 5, false});  // unanswered: either count is sound
  History::Final f = final_state({{"a", 2}, {"b", 1}});
  auto bad = h.check(f);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("job a runs 2 copies after healing, not the 3"), std::string::npos);
  f.exists.erase("b");
  bad = h.check(f);
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_NE(bad[1].find("acknowledged job b is gone"), std::string::npos);
  // A stopped job may be gone.
  h.call({4, "stop", "b", 0, true});
  EXPECT_EQ(h.check(f).size(), 1u);
}

TEST(History, ATaskNoDecisionAskedForIsFound) {
  History h;
  h.call({0, "create", "a", 2, true});
  h.call({1, "scale", "a", 4, false});  // may have been done: indexes 2 and 3 are sound
  h.copy({"a", "a.3.1", "m0", 3, 10, 0});
  h.copy({"a", "a.4.1", "m0", 4, 10, 0});
  h.copy({"z", "z.0.1", "m1", 0, 10, 0});
  auto bad = h.check(final_state({{"a", 2}}));
  ASSERT_EQ(bad.size(), 2u) << h.dump();
  EXPECT_NE(bad[0].find("a.4.1"), std::string::npos);
  EXPECT_NE(bad[1].find("z.0.1 on m1 is of no job"), std::string::npos);
}

TEST(History, AFaultNotHealedIsFoundAndFaultsAreCountedByKind) {
  History h;
  size_t a = h.fault("partition: m0 both ways", 10);
  size_t b = h.fault("partition: m1 answers only", 20);
  h.fault("agent restart: m2", 30);
  h.heal(a, 15);
  h.heal(b, 25);
  auto bad = h.check({});
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "fault not healed: agent restart: m2");
  auto counts = h.fault_counts();
  EXPECT_EQ(counts["partition"], 2);
  EXPECT_EQ(counts["agent restart"], 1);
}

}  // namespace
}  // namespace weft::testing
