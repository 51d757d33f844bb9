// Host profiles (TOML) as weft-sidekick loads them.
#include <cstdint>
#include <string>

#include "sidekick/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)weft::sidekick::parse_profile_text(text, "fuzz.toml");
  return 0;
}
