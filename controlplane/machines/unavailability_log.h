// The machines' unavailability events (docs/machines.md): a machine dead, failed,
// drained or back, with when and why; the latest kMaxEvents kept, oldest first, and
// those recorded since the daemon last took them (what it must persist).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace weft::cp {

struct Unavailability {
  uint64_t at_us = 0;
  std::string machine;
  std::string kind;  // "dead", "failed", "drain", "back"
  std::string detail;
};

class UnavailabilityLog {
 public:
  static constexpr size_t kMaxEvents = 10000;

  void record(Unavailability e) {
    events_.push_back(std::move(e));
    unsaved_ = std::min(unsaved_ + 1, kMaxEvents);
    if (events_.size() > kMaxEvents) events_.pop_front();
  }
  // The latest events, oldest first.
  const std::deque<Unavailability>& all() const { return events_; }
  // Events recorded since the last call.
  std::vector<Unavailability> take_new() {
    std::vector<Unavailability> out(events_.end() - static_cast<std::ptrdiff_t>(unsaved_),
                                    events_.end());
    unsaved_ = 0;
    return out;
  }
  // After a restart: the stored events, oldest first, instead of any the restore made.
  void restore(std::vector<Unavailability> events) {
    events_.assign(events.begin(), events.end());
    while (events_.size() > kMaxEvents) events_.pop_front();
    unsaved_ = 0;
  }

 private:
  std::deque<Unavailability> events_;
  size_t unsaved_ = 0;  // events at the end of events_ not yet taken
};

}  // namespace weft::cp
