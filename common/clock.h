// Clocks in microseconds, and the wall clock as text.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace weft {

uint64_t now_monotonic_us();
uint64_t now_realtime_us();
// "2026-11-22T02:05:03Z" for microseconds since the epoch; empty for <= 0.
std::string format_rfc3339(int64_t realtime_us);

// Notices a step of the wall clock (an operator's `date -s`, NTP stepping a clock that
// was far off, a VM resumed): the wall clock's offset from the monotonic one changes by
// more than `threshold_us` between two readings. Pure; the daemon reads both clocks.
class WallClockSteps {
 public:
  WallClockSteps() = default;
  explicit WallClockSteps(int64_t threshold_us) : threshold_us_(threshold_us) {}
  // The step since the last reading (µs; > 0: forward), or 0 when none.
  int64_t observe(uint64_t monotonic_us, uint64_t realtime_us) {
    int64_t offset = static_cast<int64_t>(realtime_us) - static_cast<int64_t>(monotonic_us);
    int64_t step = seen_ ? offset - std::exchange(offset_, offset) : 0;
    offset_ = offset;
    seen_ = true;
    // Between two readings NTP's slew and the readings' own jitter are far below a
    // second: not steps.
    return step >= threshold_us_ || step <= -threshold_us_ ? step : 0;
  }

 private:
  int64_t threshold_us_ = 1'000'000;
  int64_t offset_ = 0;
  bool seen_ = false;
};

}  // namespace weft
