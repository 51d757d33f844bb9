// Other owners of the settings a profile changes: systemd-sysctl drop-ins that set the
// same keys again at boot, a running irqbalance that moves IRQs back, an active TuneD.
// Found by reading files under the HostPaths root; reported, never fatal.
#pragma once

#include <string>
#include <vector>

#include "common/paths.h"
#include "sidekick/profile.h"

namespace weft::sidekick {

struct Conflict {
  std::string knob;   // knob id, or the family ("irq") for whole-family conflicts
  std::string owner;  // "/etc/sysctl.d/99-x.conf:3", "irqbalance (pid 812)", "tuned"
  std::string detail;
};

std::vector<Conflict> detect_conflicts(const std::vector<Knob>& knobs, const HostPaths& host);

// TuneD profile (ini) -> weft profile (TOML). Every setting weft cannot express is listed
// in `unconverted` as "section.key = value: why".
struct TunedImport {
  std::string toml;
  std::vector<std::string> unconverted;
};
TunedImport import_tuned(const std::string& ini_text, const std::string& name);

}  // namespace weft::sidekick
