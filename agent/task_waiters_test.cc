#include "agent/task_waiters.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace weft::agent {
namespace {

using json = nlohmann::json;

class TaskWaitersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto l = EventLoop::create();
    ASSERT_TRUE(l.ok());
    loop_ = std::move(l).value();
    waiters_ = std::make_unique<TaskWaiters>(
        *loop_, [this](const std::string& id, bool remove) { return answer(id, remove); });
  }
  // The tasks known (id -> ended) and what the waiters were answered, in order.
  Result<json> answer(const std::string& id, bool remove) {
    auto it = tasks_.find(id);
    if (it == tasks_.end()) return make_error("no task '" + id + "'");
    json j{{"id", id}, {"ended", it->second}};
    if (remove && it->second) {
      tasks_.erase(it);
      j["removed"] = true;
    }
    return j;
  }
  rpc::ReplyFn record(const std::string& who) {
    return [this, who](Result<json> r) {
      answers_.push_back(who + ":" + (r.ok() ? r->dump() : "error " + r.error().message));
    };
  }
  void run_for(
      uint64_t us, const std::function<bool()>& done = [] { return false; }) {
    uint64_t end = now_monotonic_us() + us;
    while (!done() && now_monotonic_us() < end) ASSERT_TRUE(loop_->run_once(10'000).ok());
  }

  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<TaskWaiters> waiters_;
  std::map<std::string, bool> tasks_;
  std::vector<std::string> answers_;
};

TEST_F(TaskWaitersTest, AnEndAnswersItsWaitersOnTheNextIterationRemoversLast) {
  tasks_ = {{"a", false}, {"b", false}};
  uint64_t far = now_monotonic_us() + 60'000'000;
  ASSERT_TRUE(waiters_->add("a", record("rm"), far, /*remove=*/true));
  ASSERT_TRUE(waiters_->add("a", record("w1"), far, false));
  ASSERT_TRUE(waiters_->add("a", record("rm2"), far, true));
  ASSERT_TRUE(waiters_->add("b", record("wb"), far, false));
  tasks_["a"] = true;
  waiters_->ended("a");
  waiters_->ended("c");           // nobody waits for c
  EXPECT_TRUE(answers_.empty());  // not while the code that ended it runs
  run_for(1'000'000, [&] { return answers_.size() == 3; });
  ASSERT_EQ(answers_.size(), 3u);
  EXPECT_EQ(answers_[0], R"(w1:{"ended":true,"id":"a"})");
  EXPECT_EQ(answers_[1], R"(rm:{"ended":true,"id":"a","removed":true})");
  EXPECT_EQ(answers_[2], "rm2:error no task 'a'");  // the first remover took it
  EXPECT_EQ(waiters_->size(), 1u);                  // b still waits
}

TEST_F(TaskWaitersTest, AWaiterIsAnsweredAtItsDeadlineWithTheTaskAsItIs) {
  tasks_ = {{"a", false}};
  uint64_t now = now_monotonic_us();
  ASSERT_TRUE(waiters_->add("a", record("late"), now + 400'000, true));
  ASSERT_TRUE(waiters_->add("a", record("soon"), now + 100'000, true));
  ASSERT_TRUE(waiters_->add("gone", record("gone"), now + 100'000, false));
  run_for(2'000'000, [&] { return answers_.size() == 2; });
  ASSERT_EQ(answers_.size(), 2u);
  uint64_t at = now_monotonic_us() - now;
  EXPECT_GE(at, 100'000u);
  EXPECT_LT(at, 400'000u);
  std::sort(answers_.begin(), answers_.end());
  EXPECT_EQ(answers_[0], "gone:error no task 'gone'");
  EXPECT_EQ(answers_[1], R"(soon:{"ended":false,"id":"a"})");  // not ended: not removed
  run_for(2'000'000, [&] { return answers_.size() == 3; });
  ASSERT_EQ(answers_.size(), 3u);
  EXPECT_EQ(answers_[2], R"(late:{"ended":false,"id":"a"})");
  EXPECT_GE(now_monotonic_us() - now, 400'000u);
  EXPECT_EQ(waiters_->size(), 0u);
  EXPECT_EQ(tasks_.count("a"), 1u);
}

TEST_F(TaskWaitersTest, AtMostKMaxWait) {
  tasks_ = {{"a", false}};
  uint64_t far = now_monotonic_us() + 60'000'000;
  for (size_t i = 0; i < TaskWaiters::kMax; ++i)
    ASSERT_TRUE(waiters_->add(
        "a", [](Result<json>) {}, far, false));
  EXPECT_FALSE(waiters_->add("a", record("one-more"), far, false));
  EXPECT_EQ(waiters_->size(), TaskWaiters::kMax);
  tasks_["a"] = true;
  waiters_->ended("a");
  run_for(1'000'000, [&] { return waiters_->size() == 0; });
  EXPECT_EQ(waiters_->size(), 0u);
  EXPECT_TRUE(answers_.empty());
}

}  // namespace
}  // namespace weft::agent
