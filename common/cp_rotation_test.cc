// Which replica a machine daemon tries next, and the backoff between rounds
// (cp_rotation.h): the policy on its own, without sockets.
#include "common/cp_rotation.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(EndpointRotation, ReplicasAreTriedInTurnAndOnlyAWholeRoundBacksOff) {
  EndpointRotation r({"a", "b", "c"}, 1);
  EXPECT_EQ(r.current(), "a");
  EXPECT_EQ(r.next_delay_us(), 100'000u);
  EXPECT_EQ(r.current(), "b");
  EXPECT_EQ(r.next_delay_us(), 100'000u);
  EXPECT_EQ(r.current(), "c");
  // Twice round (six tries) without a leader: the first backoff, 0.5 s plus jitter.
  for (int i = 0; i < 3; ++i) r.next_delay_us();
  uint64_t d = r.next_delay_us();
  EXPECT_GE(d, 500'000u);
  EXPECT_LE(d, 625'000u);
  // The next rounds double it, up to 30 s (plus a quarter).
  uint64_t last = 0;
  for (int round = 0; round < 12; ++round) {
    for (int i = 0; i < 5; ++i) EXPECT_EQ(r.next_delay_us(), 100'000u);
    last = r.next_delay_us();
  }
  EXPECT_GE(last, 30'000'000u);
  EXPECT_LE(last, 37'500'000u);
  // An accepted hello starts again from 0.5 s.
  r.accepted();
  for (int i = 0; i < 5; ++i) r.next_delay_us();
  EXPECT_LE(r.next_delay_us(), 625'000u);
}

TEST(EndpointRotation, AFollowerSendsTheNextTryToTheLeaderItNames) {
  EndpointRotation r({"a", "b", "c"}, 1);
  r.follower_named("c");
  EXPECT_EQ(r.next_delay_us(), 100'000u);
  EXPECT_EQ(r.current(), "c");
  // A leader that is not one of ours: on to the next endpoint.
  r.follower_named("elsewhere");
  r.next_delay_us();
  EXPECT_EQ(r.current(), "a");
}

TEST(EndpointRotation, WhileAFollowerAnswersTheBackoffStaysShort) {
  EndpointRotation r({"a", "b"}, 7);
  for (int round = 0; round < 10; ++round) {
    r.follower_named("nowhere");
    r.next_delay_us();
    r.follower_named("nowhere");
    uint64_t d = r.next_delay_us();
    EXPECT_LE(d, 2'500'000u) << "round " << round;
  }
}

TEST(EndpointRotation, AHolderThatAnswersNowhereGivesTheMachineBack) {
  EndpointRotation r({"broker"}, 1);
  r.moved({"s1", "s2"});
  EXPECT_TRUE(r.held());
  r.next_delay_us();  // the move itself counts as a redirect: s1 first
  EXPECT_EQ(r.current(), "s1");
  r.next_delay_us();
  EXPECT_EQ(r.current(), "s2");
  r.next_delay_us();
  EXPECT_EQ(r.current(), "s1");
  EXPECT_TRUE(r.held());
  // Two rounds of the holder's replicas (four tries) unanswered: back to the brokers.
  r.next_delay_us();
  EXPECT_FALSE(r.held());
  EXPECT_EQ(r.current(), "broker");
  // And a move back to "" (the configured endpoints) is one too.
  r.moved({"s3"});
  r.moved({});
  EXPECT_FALSE(r.held());
  r.next_delay_us();
  EXPECT_EQ(r.current(), "broker");
}

}  // namespace
}  // namespace weft
