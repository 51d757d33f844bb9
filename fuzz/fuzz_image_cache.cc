// The agent's image cache record (state_dir/images/cache.json), read at every start:
// whatever the file holds, parsing returns checked entries and never crashes or throws.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "agent/image/cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  weft::image::CacheRecord r = weft::image::parse_cache_record(text);
  for (const auto& [m, img] : r.images) {
    if (img.layers.empty()) __builtin_trap();  // an image without layers is never kept
    if (!img.package && !img.config) __builtin_trap();
  }
  return 0;
}
