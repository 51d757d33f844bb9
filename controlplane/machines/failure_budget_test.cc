#include "controlplane/machines/failure_budget.h"

#include <gtest/gtest.h>

#include <map>

namespace weft::cp {
namespace {

constexpr uint64_t kSec = 1'000'000;

TEST(TokenBucket, StartsFullRefillsAtItsRateAndNeverPastItsBurst) {
  TokenBucket b(60, 3);  // one a second, three at most
  EXPECT_TRUE(b.peek(0));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(b.take(0));
  EXPECT_FALSE(b.take(0));
  EXPECT_FALSE(b.peek(kSec / 2));
  EXPECT_TRUE(b.peek(kSec));  // peeking takes nothing
  EXPECT_TRUE(b.take(kSec));
  EXPECT_FALSE(b.take(kSec));
  EXPECT_TRUE(b.take(1000 * kSec));  // a long quiet time refills up to the burst only
  EXPECT_TRUE(b.take(1000 * kSec));
  EXPECT_TRUE(b.take(1000 * kSec));
  EXPECT_FALSE(b.take(1000 * kSec));
}

struct Fleet {
  std::map<MachineId, std::string> domain;
  std::set<MachineId> dead;
  std::function<bool(MachineId)> still_down() {
    return [this](MachineId m) { return dead.count(m) > 0; };
  }
  std::function<std::string(MachineId)> domain_of() {
    return [this](MachineId m) { return domain.at(m); };
  }
};

TEST(FailureBudget, MachinesOfOneDomainTakeOneTokenAndTheRestWaitOldestFirst) {
  FailureBudget budget({/*per_min=*/60, /*burst_fraction=*/0, /*breaker=*/1.0});
  Fleet f;
  // 25 domains of two machines; every machine of them goes down.
  for (MachineId m = 0; m < 50; ++m) {
    f.domain[m] = "rack" + std::to_string(m / 2);
    f.dead.insert(m);
    budget.went_down(m);
  }
  budget.count_waiting();
  auto step = budget.step(0, 50, f.still_down(), f.domain_of());
  // The burst is 20 tokens (the least): 20 domains, 40 machines.
  ASSERT_EQ(step.replace.size(), 40u);
  EXPECT_EQ(step.replace.front(), 0u);
  EXPECT_EQ(budget.waiting(), 10u);
  // A machine back meanwhile leaves the queue without a token.
  f.dead.erase(40);
  f.dead.erase(41);
  auto later = budget.step(kSec, 50, f.still_down(), f.domain_of());
  // One token a second: rack20 is back and takes none; rack21 takes it.
  EXPECT_EQ(later.replace, (std::vector<MachineId>{42, 43}));
  EXPECT_EQ(budget.waiting(), 6u);
  EXPECT_TRUE(budget.step(kSec, 50, f.still_down(), f.domain_of()).replace.empty());
  auto next = budget.step(2 * kSec, 50, f.still_down(), f.domain_of());
  EXPECT_EQ(next.replace, (std::vector<MachineId>{44, 45}));
  EXPECT_EQ(budget.waiting(), 4u);
}

TEST(FailureBudget, TheBreakerHoldsEverythingWhileTooMuchOfTheFleetIsDown) {
  FailureBudget budget({60, 0.01, /*breaker=*/0.3});
  Fleet f;
  for (MachineId m = 0; m < 20; ++m) f.domain[m] = "d" + std::to_string(m);
  for (MachineId m = 0; m < 7; ++m) {  // 35% of 20
    f.dead.insert(m);
    budget.went_down(m);
  }
  budget.count_waiting();
  auto held = budget.step(0, 20, f.still_down(), f.domain_of());
  EXPECT_TRUE(held.replace.empty());
  EXPECT_TRUE(held.breaker_opened);
  EXPECT_TRUE(budget.breaker_open());
  auto again = budget.step(kSec, 20, f.still_down(), f.domain_of());
  EXPECT_FALSE(again.breaker_opened);  // reported once, then every 30 s
  EXPECT_TRUE(budget.step(31 * kSec, 20, f.still_down(), f.domain_of()).breaker_opened);
  // Two come back: 25% is under the breaker; the rest are replaced.
  f.dead.erase(0);
  f.dead.erase(1);
  budget.back(0);
  budget.back(1);
  auto open = budget.step(32 * kSec, 20, f.still_down(), f.domain_of());
  EXPECT_TRUE(open.breaker_closed);
  EXPECT_EQ(open.replace.size(), 5u);
  EXPECT_FALSE(budget.breaker_open());
}

TEST(FailureBudget, ASmallFleetHasNoBreaker) {
  FailureBudget budget({60, 0.01, 0.3});
  Fleet f;
  for (MachineId m = 0; m < 4; ++m) {
    f.domain[m] = "d";
    f.dead.insert(m);
    budget.went_down(m);
  }
  budget.count_waiting();
  auto step = budget.step(0, 4, f.still_down(), f.domain_of());
  EXPECT_EQ(step.replace.size(), 4u);  // all of one domain: one token
  EXPECT_FALSE(budget.breaker_open());
}

}  // namespace
}  // namespace weft::cp
