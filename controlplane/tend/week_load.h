// The synthetic week of load that autoscaling is tested and measured on (a synthesis,
// shipped here; controlplane/tend/autoscaler_test.cc and bench/autoscale_week): a day of 5
// units at night, rising over an hour from 8:00 to a plateau (30 units on weekdays, 10 at
// weekends: days 5 and 6) until 17:00, falling over an hour to 18:00.
#pragma once

#include <cstdint>

#include "controlplane/tend/autoscaler.h"

namespace weft::cp {

inline double weekly_load(uint64_t t_us) {
  constexpr uint64_t kHourUs = Autoscaler::kDayUs / 24;
  double hour = static_cast<double>(t_us % Autoscaler::kDayUs) / static_cast<double>(kHourUs);
  int day = static_cast<int>(t_us / Autoscaler::kDayUs) % 7;
  double peak = day >= 5 ? 10 : 30;
  double shape = hour < 8 || hour >= 18 ? 0 : hour < 9 ? hour - 8 : hour >= 17 ? 18 - hour : 1;
  return 5 + (peak - 5) * shape;
}

}  // namespace weft::cp
