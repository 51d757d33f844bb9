// Sizes and durations as operators write them in configs, job files and flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace weft {

// "256M", "1G", "4096", "512k" (binary units) -> bytes. "max" is rejected here.
Result<uint64_t> parse_size(std::string_view s);
// "500ms", "5s", "2m", "1h", "1.5s", "10" (seconds) -> microseconds.
Result<uint64_t> parse_duration_us(std::string_view s);
// Durations are capped at 100 years, so that `now + duration` never overflows.
inline constexpr uint64_t kMaxDurationUs = 100ull * 366 * 24 * 3600 * 1'000'000;
// Seconds given as a JSON number; NaN, negative and over-long values are errors.
Result<uint64_t> seconds_to_us(double seconds);
std::string format_size(uint64_t bytes);

}  // namespace weft
