#include "hcs/verdict.h"

#include <gtest/gtest.h>

namespace weft::hcs {
namespace {

constexpr uint64_t kSec = 1'000'000;

TEST(Verdict, UnknownUntilFirstSampleAndNeverReadAsOk) {
  std::map<std::string, ProbeState> probes;
  EXPECT_EQ(machine_verdict(probes), Health::kUnknown);
  probes["a"].sample(Health::kOk, 1 * kSec);
  probes["b"];  // never sampled
  EXPECT_EQ(machine_verdict(probes), Health::kUnknown);
  probes["b"].sample(Health::kOk, 1 * kSec);
  EXPECT_EQ(machine_verdict(probes), Health::kOk);
}

TEST(Verdict, EnteringFailedTakesConsecutiveBadSamples) {
  ProbeState p(Hysteresis{3, 2, 10 * kSec, 100, 600 * kSec});
  p.sample(Health::kOk, 0);
  p.sample(Health::kFailed, 1 * kSec);
  p.sample(Health::kFailed, 2 * kSec);
  EXPECT_EQ(p.state(), Health::kOk);  // two bad samples are not yet a verdict
  p.sample(Health::kOk, 3 * kSec);
  p.sample(Health::kFailed, 4 * kSec);
  p.sample(Health::kFailed, 5 * kSec);
  EXPECT_EQ(p.state(), Health::kOk);  // the run was broken
  EXPECT_TRUE(p.sample(Health::kFailed, 6 * kSec));
  EXPECT_EQ(p.state(), Health::kFailed);
}

TEST(Verdict, LeavingFailedNeedsGoodRunAndHoldDown) {
  ProbeState p(Hysteresis{1, 2, 30 * kSec, 100, 600 * kSec});
  p.sample(Health::kFailed, 0);
  ASSERT_EQ(p.state(), Health::kFailed);
  p.sample(Health::kOk, 1 * kSec);
  p.sample(Health::kOk, 2 * kSec);
  EXPECT_EQ(p.state(), Health::kFailed);  // good run, but inside the hold-down
  p.sample(Health::kOk, 31 * kSec);
  EXPECT_EQ(p.state(), Health::kOk);
  p.sample(Health::kFailed, 32 * kSec);
  p.sample(Health::kDegraded, 62 * kSec);  // degraded does not end FAILED
  EXPECT_EQ(p.state(), Health::kFailed);
}

TEST(Verdict, RecoveryToDegradedCountsAsLeavingFailed) {
  Hysteresis h;
  h.fail_after = 1;
  h.recover_after = 2;
  h.hold_down_us = 0;
  ProbeState st(h);
  st.sample(Health::kFailed, 1);
  EXPECT_EQ(st.state(), Health::kFailed);
  st.sample(Health::kDegraded, 2);
  EXPECT_EQ(st.state(), Health::kFailed);  // one non-failed sample is not a recovery
  st.sample(Health::kUnknown, 3);
  st.sample(Health::kDegraded, 4);
  EXPECT_EQ(st.state(), Health::kFailed);  // unknown broke the run
  st.sample(Health::kDegraded, 5);
  EXPECT_EQ(st.state(), Health::kDegraded);
}

TEST(Verdict, FlappingIsPinnedAtDegraded) {
  ProbeState p(Hysteresis{1, 1, 0, 4, 100 * kSec});
  uint64_t t = 0;
  for (int i = 0; i < 3; ++i) {
    p.sample(Health::kFailed, t += kSec);
    p.sample(Health::kOk, t += kSec);
  }
  EXPECT_TRUE(p.pinned());
  EXPECT_EQ(p.state(), Health::kDegraded);  // OK, but too unstable to be believed
  p.sample(Health::kOk, t += 200 * kSec);   // a whole window without a transition
  EXPECT_FALSE(p.pinned());
  EXPECT_EQ(p.state(), Health::kOk);
}

TEST(Verdict, StateSurvivesARestart) {
  Hysteresis h{1, 3, 30 * kSec, 4, 600 * kSec};
  ProbeState p(h);
  p.sample(Health::kFailed, 5 * kSec, "disk full");
  ProbeState q = ProbeState::from_json(p.to_json(), h);
  EXPECT_EQ(q.state(), Health::kFailed);
  EXPECT_EQ(q.detail(), "disk full");
  q.sample(Health::kOk, 6 * kSec);
  EXPECT_EQ(q.state(), Health::kFailed);  // the hold-down carried over
}

TEST(Verdict, MachineVerdictIsTheWorst) {
  std::map<std::string, ProbeState> probes;
  probes["a"].sample(Health::kOk, 0);
  probes["b"].sample(Health::kDegraded, 0);
  EXPECT_EQ(machine_verdict(probes), Health::kDegraded);
  ProbeState f(Hysteresis{1, 1, 0, 100, 1});
  f.sample(Health::kFailed, 0);
  probes["c"] = f;
  EXPECT_EQ(machine_verdict(probes), Health::kFailed);
}

}  // namespace
}  // namespace weft::hcs
