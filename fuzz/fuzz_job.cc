// Job files (TOML) as weftctl reads them, and cron schedules (periodic jobs).
#include <cstdint>
#include <string>

#include "common/cron.h"
#include "common/job_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)weft::parse_job_file(text, "job.toml");
  // The same bytes as a periodic job's schedule, and its next period.
  if (auto c = weft::parse_cron(text); c.ok()) (void)c->next_after(1795824000);
  return 0;
}
