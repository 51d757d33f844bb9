// Cron schedules for periodic jobs (docs/jobs.md, "Periodic jobs"), read by the one job
// validator and by the control plane that starts the periods. Times are the control
// plane's clock in UTC, in whole seconds since the epoch.
//
//   "*/15 * * * *"        minute hour day-of-month month day-of-week (Vixie cron)
//   "*/10 * * * * *"      a leading seconds field (six fields)
//   "@hourly", "@daily" (= "@midnight"), "@weekly", "@monthly", "@yearly" (= "@annually")
//
// A field is a comma list of `*`, `N`, `N-M`, each optionally `/STEP`; months may be
// JAN-DEC and days of the week SUN-SAT (0 or 7 is Sunday). When both day fields are
// restricted a day matching either runs (as cron does); otherwise both must match.
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace weft {

struct CronSchedule {
  std::bitset<60> seconds, minutes;
  std::bitset<24> hours;
  std::bitset<32> days;     // 1-31
  std::bitset<13> months;   // 1-12
  std::bitset<7> weekdays;  // 0 = Sunday
  bool days_any = true, weekdays_any = true;

  // The first time strictly after `after` (seconds since the epoch, UTC) the schedule
  // names, or nullopt when there is none in the next ten years (Feb 30, say).
  std::optional<int64_t> next_after(int64_t after) const;
  // The shortest time, in seconds, between two times it names: within a day, and from a
  // day's last to the next day's first as if every day ran (so never more than the real
  // gap; a schedule that names one time a day gives 86400).
  int64_t shortest_gap() const;
};

// Errors name the field ("minute: 61 is out of range 0-59").
Result<CronSchedule> parse_cron(std::string_view text);

}  // namespace weft
