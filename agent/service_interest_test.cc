#include "agent/service_interest.h"

#include <gtest/gtest.h>

#include "common/clock.h"

namespace weft::agent {
namespace {

using json = nlohmann::json;

// One service.interest call as the control plane received it.
struct Call {
  std::vector<std::string> jobs, forget;
  ServiceInterest::Reply reply;
};

Service one_endpoint(const std::string& job) {
  Service s;
  s.entitlement = "frontend";
  s.endpoints.push_back({job + ".0", 0, 1, "m0", "10.0.0.1", {{"http", 20001}}});
  return s;
}

// The control plane's answer to a call: the asked jobs' endpoints.
json answer(const Call& c) {
  ServiceUpdate u;
  u.version = 9;
  for (const auto& j : c.jobs) u.services[j] = one_endpoint(j);
  return to_json(u);
}

class ServiceInterestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto l = EventLoop::create();
    ASSERT_TRUE(l.ok());
    loop_ = std::move(l).value();
  }
  std::unique_ptr<ServiceInterest> make(ServiceInterest::Options opts) {
    return std::make_unique<ServiceInterest>(
        *loop_, catalog_,
        [this](const std::vector<std::string>& jobs, const std::vector<std::string>& forget,
               ServiceInterest::Reply reply) {
          if (offline_) return false;
          calls_.push_back({jobs, forget, std::move(reply)});
          return true;
        },
        [this] { ++answered_; }, opts);
  }
  // Runs the loop until `done` or `us` pass.
  void run_for(
      uint64_t us, const std::function<bool()>& done = [] { return false; }) {
    uint64_t end = now_monotonic_us() + us;
    while (!done() && now_monotonic_us() < end) ASSERT_TRUE(loop_->run_once(10'000).ok());
  }
  void answer_all() {
    for (auto& c : calls_)
      if (c.reply) std::exchange(c.reply, nullptr)(answer(c));
  }
  bool holds(const std::string& job) const { return catalog_.find(job, "frontend") != nullptr; }

  std::unique_ptr<EventLoop> loop_;
  ServiceCatalog catalog_;
  std::vector<Call> calls_;
  int answered_ = 0;
  bool offline_ = false;
};

TEST_F(ServiceInterestTest, NamesAskedInOneIterationGoInOneCallAndWaitForItsAnswer) {
  auto si = make({});
  EXPECT_TRUE(si->must_wait("web"));
  EXPECT_TRUE(si->must_wait("db"));
  EXPECT_TRUE(si->must_wait("web"));       // still waiting
  EXPECT_FALSE(si->must_wait("-no-job"));  // a name no job can have is not asked
  run_for(1'000'000, [&] { return !calls_.empty(); });
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0].jobs, (std::vector<std::string>{"web", "db"}));
  EXPECT_TRUE(calls_[0].forget.empty());
  answer_all();
  EXPECT_EQ(answered_, 1);
  EXPECT_EQ(si->waiting(), 0u);
  EXPECT_TRUE(holds("web"));
  EXPECT_TRUE(holds("db"));
  EXPECT_FALSE(si->must_wait("web"));  // held now
  EXPECT_EQ(si->jobs(), (std::vector<std::string>{"db", "web"}));
}

TEST_F(ServiceInterestTest, ANameNotAskedForLatelyIsForgottenAndTheControlPlaneTold) {
  auto si = make({.forget_after_us = 1'000'000, .sweep_us = 100'000});
  EXPECT_TRUE(si->must_wait("web"));
  EXPECT_TRUE(si->must_wait("db"));
  run_for(1'000'000, [&] { return !calls_.empty(); });
  answer_all();
  // web is asked for every 50 ms, db no more: db goes after 1 s, web stays.
  uint64_t end = now_monotonic_us() + 1'600'000;
  while (now_monotonic_us() < end) {
    EXPECT_FALSE(si->must_wait("web"));
    run_for(50'000);
  }
  EXPECT_EQ(si->jobs(), (std::vector<std::string>{"web"}));
  EXPECT_EQ(si->forgotten(), 1u);
  EXPECT_TRUE(holds("web"));
  EXPECT_FALSE(holds("db"));  // its endpoints went with it
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_TRUE(calls_[1].jobs.empty());
  EXPECT_EQ(calls_[1].forget, (std::vector<std::string>{"db"}));
  // A push sent before the control plane heard brings nothing of db back.
  ServiceUpdate push;
  push.version = 10;
  push.services["db"] = one_endpoint("db");
  push.services["web"] = one_endpoint("web");
  si->filter(push);
  EXPECT_EQ(push.services.size(), 1u);
  EXPECT_TRUE(push.services.count("web"));
  // Asked for again, it waits for the control plane again.
  EXPECT_TRUE(si->must_wait("db"));
  run_for(1'000'000, [&] { return calls_.size() == 3; });
  ASSERT_EQ(calls_.size(), 3u);
  EXPECT_EQ(calls_[2].jobs, (std::vector<std::string>{"db"}));
}

TEST_F(ServiceInterestTest, AtItsBoundTheLeastRecentlyAskedNameMakesRoom) {
  auto si = make({.max_jobs = 2});
  EXPECT_TRUE(si->must_wait("a"));
  EXPECT_TRUE(si->must_wait("b"));
  // Both are being asked: a third is answered from the copy, nothing forgotten.
  EXPECT_FALSE(si->must_wait("c"));
  run_for(1'000'000, [&] { return !calls_.empty(); });
  answer_all();
  run_for(2'000);
  EXPECT_FALSE(si->must_wait("a"));  // a asked last: b is the least recent
  EXPECT_TRUE(si->must_wait("c"));
  EXPECT_EQ(si->jobs(), (std::vector<std::string>{"a", "c"}));
  EXPECT_FALSE(holds("b"));
  run_for(1'000'000, [&] { return calls_.size() == 2; });
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_EQ(calls_[1].jobs, (std::vector<std::string>{"c"}));
  EXPECT_EQ(calls_[1].forget, (std::vector<std::string>{"b"}));  // in the same call, first
}

TEST_F(ServiceInterestTest, WithoutAControlPlaneQueriesAreAnsweredAtOnce) {
  offline_ = true;
  auto si = make({.forget_after_us = 500'000, .sweep_us = 50'000});
  EXPECT_TRUE(si->must_wait("web"));  // asked at the end of the iteration
  run_for(100'000, [&] { return si->waiting() == 0; });
  EXPECT_EQ(si->waiting(), 0u);
  EXPECT_EQ(answered_, 1);
  EXPECT_EQ(si->jobs(), (std::vector<std::string>{"web"}));  // named at registration
  run_for(1'200'000);
  EXPECT_TRUE(si->jobs().empty());  // forgotten; the next session starts without it
  EXPECT_TRUE(calls_.empty());
}

TEST_F(ServiceInterestTest, AControlPlaneBeforeInterestKeepsItsPushesWhole) {
  auto si = make({});
  EXPECT_TRUE(si->must_wait("web"));
  run_for(1'000'000, [&] { return !calls_.empty(); });
  ASSERT_EQ(calls_.size(), 1u);
  std::exchange(calls_[0].reply, nullptr)(make_error("no method service.interest"));
  ServiceUpdate push;
  push.version = 3;
  push.services["db"] = one_endpoint("db");
  si->filter(push);
  EXPECT_EQ(push.services.size(), 1u);  // it pushes every job: all kept
}

}  // namespace
}  // namespace weft::agent
