#include "controlplane/scheduling/machine_ports.h"

namespace weft::cp {

void MachinePorts::set(uint16_t first, uint16_t last, const std::vector<uint16_t>& reserved) {
  first_ = first;
  last_ = last;
  reserved_ = std::unordered_set<uint16_t>(reserved.begin(), reserved.end());
  in_range_ = 0;
  for (uint16_t p : claimed_) in_range_ += in_range(p);
  reserved_in_range_ = 0;
  for (uint16_t p : reserved_) reserved_in_range_ += in_range(p) && !claimed(p);
}

bool MachinePorts::fit(const std::vector<uint16_t>& fixed, int dynamic, int taken) const {
  if (!fixed.empty()) {
    if (taken > 0) return false;  // one claim of a port per machine
    for (uint16_t p : fixed)
      if (this->taken(p)) return false;
  }
  if (dynamic > 0) {
    if (last_ < first_) return false;
    int64_t range = int64_t{last_} - first_ + 1;
    // Fixed ports inside the range would be taken by the task itself.
    int64_t own = 0;
    for (uint16_t p : fixed) own += in_range(p);
    if (range - in_range_ - reserved_in_range_ - own < int64_t{dynamic} * (taken + 1)) return false;
  }
  return true;
}

std::vector<uint16_t> MachinePorts::take(size_t want) {
  std::vector<uint16_t> out;
  if (want == 0 || last_ < first_) return out;
  const uint32_t span = uint32_t{last_} - first_ + 1;
  uint32_t at = next_ >= first_ && next_ <= last_ ? next_ - first_ : 0;
  for (uint32_t tried = 0; tried < span && out.size() < want; ++tried, at = (at + 1) % span) {
    auto p = static_cast<uint16_t>(first_ + at);
    if (taken(p)) continue;
    claim(p);
    out.push_back(p);
  }
  next_ = static_cast<uint16_t>(first_ + at);
  return out;
}

}  // namespace weft::cp
