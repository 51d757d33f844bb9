#include "agent/task_waiters.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace weft::agent {

TaskWaiters::TaskWaiters(EventLoop& loop, Answer answer)
    : loop_(loop), answer_(std::move(answer)) {}

bool TaskWaiters::add(const std::string& id, rpc::ReplyFn reply, uint64_t deadline_us,
                      bool remove) {
  if (waiting_.size() >= kMax) return false;
  waiting_.emplace(id, Waiter{std::move(reply), deadline_us, remove});
  if (!timer_.active() || deadline_us < timer_at_) arm(deadline_us);
  return true;
}

void TaskWaiters::ended(const std::string& id) {
  if (waiting_.find(id) == waiting_.end()) return;
  ended_.insert(id);
  if (ended_defer_.active()) return;
  auto d = loop_.add_defer([this] {
    ended_defer_.reset();
    for (const auto& ended : std::exchange(ended_, {})) answer_all(ended);
  });
  if (d.ok()) ended_defer_ = std::move(d).value();
}

void TaskWaiters::answer_all(const std::string& id) {
  auto [first, last] = waiting_.equal_range(id);
  if (first == last) return;
  std::vector<Waiter> waiting;
  for (auto it = first; it != last; ++it) waiting.push_back(std::move(it->second));
  waiting_.erase(first, last);
  // Those who asked to remove it are answered last: the others see the task first.
  std::stable_partition(waiting.begin(), waiting.end(), [](const Waiter& w) { return !w.remove; });
  for (auto& w : waiting) w.reply(answer_(id, w.remove));
}

void TaskWaiters::expire() {
  timer_.reset();
  uint64_t now = now_monotonic_us(), next = 0;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (now < it->second.deadline_us) {
      next = next == 0 ? it->second.deadline_us : std::min(next, it->second.deadline_us);
      ++it;
      continue;
    }
    Waiter w = std::move(it->second);
    std::string id = it->first;
    it = waiting_.erase(it);
    w.reply(answer_(id, false));  // not ended: nothing to remove
  }
  if (next) arm(next);
}

void TaskWaiters::arm(uint64_t at_us) {
  auto timer = loop_.add_timer_at(at_us, [this] { expire(); });
  if (!timer.ok()) return;  // answered by the next wait's timer, or the task's end
  timer_ = std::move(timer).value();
  timer_at_ = at_us;
}

}  // namespace weft::agent
