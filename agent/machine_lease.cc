#include "agent/machine_lease.h"

#include <charconv>
#include <vector>

namespace weft::agent {

namespace {

// At most ten minutes: the control plane's own bounds (controlplane.toml machine_lease).
constexpr uint64_t kMaxLeaseMs = 600'000;

}  // namespace

Status MachineLease::set_terms(const nlohmann::json& reply) {
  if (!reply.is_object() || !reply.contains("lease")) return {};
  const nlohmann::json& l = reply["lease"];
  auto ms = [&](const char* key) -> std::optional<uint64_t> {
    if (!l.is_object() || !l.contains(key) || !l[key].is_number_unsigned()) return std::nullopt;
    uint64_t v = l[key].get<uint64_t>();
    if (v == 0 || v > kMaxLeaseMs) return std::nullopt;
    return v;
  };
  auto lease = ms("duration_ms"), fence = ms("fence_after_ms");
  if (!lease) return field_error("lease.duration_ms", "must be 1 to 600000 milliseconds");
  if (!fence || *fence >= *lease)
    return field_error("lease.fence_after_ms", "must be 1 to 600000 and less than duration_ms");
  lease_us_ = *lease * 1000;
  fence_after_us_ = *fence * 1000;
  return {};
}

uint64_t MachineLease::fenced_grace(uint64_t own, uint64_t now) const {
  uint64_t kill_by = ends_at() > kKillSlackUs ? ends_at() - kKillSlackUs : 0;
  if (now >= kill_by) return 0;
  return std::min(own, kill_by - now);
}

std::string MachineLease::to_text(const std::string& boot_id) const {
  return boot_id + " " + std::to_string(renewed_from_) + " " + std::to_string(lease_us_) + " " +
         std::to_string(fence_after_us_) + "\n";
}

std::optional<MachineLease> MachineLease::from_text(std::string_view text,
                                                    const std::string& boot_id) {
  if (text.size() > 256) return std::nullopt;
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find_first_of(" \n", i);
    if (j == std::string_view::npos) j = text.size();
    if (j > i) words.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  if (words.size() != 4 || boot_id.empty() || words[0] != boot_id) return std::nullopt;
  uint64_t v[3];
  for (int k = 0; k < 3; ++k) {
    std::string_view w = words[static_cast<size_t>(k) + 1];
    auto r = std::from_chars(w.data(), w.data() + w.size(), v[k]);
    if (r.ec != std::errc() || r.ptr != w.data() + w.size()) return std::nullopt;
  }
  MachineLease l;
  l.renewed_from_ = v[0];
  l.lease_us_ = v[1];
  l.fence_after_us_ = v[2];
  if (l.lease_us_ == 0 || l.lease_us_ > kMaxLeaseMs * 1000 || l.fence_after_us_ >= l.lease_us_ ||
      l.fence_after_us_ == 0)
    return std::nullopt;
  return l;
}

}  // namespace weft::agent
