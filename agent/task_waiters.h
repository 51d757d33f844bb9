// task.wait's callers (agent/api.cc): each waits for one task to end, at most until its
// deadline, and is answered then or when the task ends, whichever comes first. A long
// poll, as Consul's blocking queries. The answers of a task's end are made on the next
// loop iteration, after the code that ended it has finished with it (an answer may
// remove the task), and those who asked to remove it are answered last, so the others
// see it first. One timer serves every deadline.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/result.h"
#include "common/rpc/session.h"

namespace weft::agent {

class TaskWaiters {
 public:
  static constexpr size_t kMax = 4096;
  // The answer for a waiter of task `id` (`remove`: it asked to forget the task once it
  // ended); an error when there is no such task any more.
  using Answer = std::function<Result<nlohmann::json>(const std::string& id, bool remove)>;
  TaskWaiters(EventLoop& loop, Answer answer);

  // False (nothing kept) when kMax callers already wait.
  bool add(const std::string& id, rpc::ReplyFn reply, uint64_t deadline_us, bool remove);
  // Task `id` ended: its waiters are answered on the next loop iteration.
  void ended(const std::string& id);
  size_t size() const { return waiting_.size(); }

 private:
  struct Waiter {
    rpc::ReplyFn reply;
    uint64_t deadline_us = 0;
    bool remove = false;
  };
  void answer_all(const std::string& id);
  void expire();
  void arm(uint64_t at_us);
  EventLoop& loop_;
  Answer answer_;
  std::multimap<std::string, Waiter> waiting_;
  Source timer_;
  uint64_t timer_at_ = 0;
  std::set<std::string> ended_;
  Source ended_defer_;
};

}  // namespace weft::agent
