// Job files (TOML) as weftctl reads them.
#include <cstdint>
#include <string>

#include "common/job_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)weft::parse_job_file(text, "job.toml");
  return 0;
}
