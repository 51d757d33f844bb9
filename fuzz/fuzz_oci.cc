// What a registry sends and what a job names: the first byte picks the parser (image
// reference, manifest or index with each media type, image configuration, a registry's
// WWW-Authenticate challenge, the registry credentials file), the rest is its input. Hostile
// documents must be refused with an error, never crash or hang.
#include <cstdint>
#include <string>

#include "common/oci.h"
#include "common/registry.h"

using namespace weft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const char* kTypes[] = {"", oci::kOciManifest, oci::kOciIndex, oci::kDockerManifest,
                                 oci::kDockerList};
  switch (data[0] % 6) {
    case 0: {
      auto r = oci::parse_image_ref(text);
      if (r.ok()) {
        auto again = oci::parse_image_ref(r->str());  // the canonical form reads back the same
        if (!again.ok() || again->str() != r->str()) __builtin_trap();
      }
      break;
    }
    case 1:
    case 2: {
      auto m = oci::parse_manifest(text, kTypes[(data[0] >> 2) % 5]);
      if (m.ok() && m->is_index) (void)oci::select_platform(m->entries, oci::host_platform());
      break;
    }
    case 3:
      (void)oci::parse_image_config(text);
      break;
    case 4:
      (void)registry::parse_challenge(text);
      break;
    default:
      (void)registry::parse_credentials(text, "credentials");
  }
  return 0;
}
