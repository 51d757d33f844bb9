// Clocks in microseconds, and the wall clock as text.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

uint64_t now_monotonic_us();
uint64_t now_realtime_us();
// "2026-11-22T02:05:03Z" for microseconds since the epoch; empty for <= 0.
std::string format_rfc3339(int64_t realtime_us);

}  // namespace weft
