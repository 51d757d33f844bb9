// The machine's lease from its control plane (docs/jobs.md, "At most one copy"), as the
// agent counts it. The control plane grants it in machine.register's reply (its
// duration and fence_after) and every answer to one of the agent's calls renews it. Like
// Chubby's, it is counted on this machine's monotonic clock from when the answered call
// was *sent*, while the control plane counts it from when it *heard* the call, which is
// later: the machine's lease always ends first. When fence_after has passed since the
// last renewal the agent stops the tasks of at-most-one jobs on its own (their grace cut
// so that they are gone kKillSlackUs before the lease ends); the control plane starts
// them elsewhere only after its own count of the lease, plus a margin for the clocks'
// rates, has ended.
//
// Pure: no clock, no file. The agent keeps the last renewal in state_dir/lease (to_text)
// so that a restarted agent fences what it finds if the lease ran out meanwhile.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft::agent {

// The reason a fenced task ends with (reported to the control plane as a failure).
inline constexpr std::string_view kFencedReason = "fenced: ";

class MachineLease {
 public:
  // How long before the lease's end a fenced task's kill is sent: room for the kernel
  // to end its processes and for this agent's own timer to fire late.
  static constexpr uint64_t kKillSlackUs = 1'000'000;

  // machine.register's reply {"lease": {"duration_ms", "fence_after_ms"}}; a reply
  // without one (an older control plane) leaves no lease: nothing is fenced. A hostile
  // or inconsistent one is refused with the field named.
  Status set_terms(const nlohmann::json& reply);
  bool has_terms() const { return lease_us_ > 0; }
  uint64_t lease_us() const { return lease_us_; }
  uint64_t fence_after_us() const { return fence_after_us_; }

  // A call sent at `sent_us` was answered by the control plane that leads.
  void renewed(uint64_t sent_us) {
    if (sent_us > renewed_from_) renewed_from_ = sent_us;
  }
  uint64_t renewed_from() const { return renewed_from_; }
  uint64_t fence_at() const { return renewed_from_ + fence_after_us_; }
  uint64_t ends_at() const { return renewed_from_ + lease_us_; }
  bool fenced(uint64_t now_us) const { return has_terms() && now_us >= fence_at(); }
  // The stop grace a task fenced at `now_us` gets: its own, cut so that its kill is sent
  // kKillSlackUs before the lease ends (0: killed at once).
  uint64_t fenced_grace(uint64_t own_grace_us, uint64_t now_us) const;

  // "boot_id renewed_from lease fence_after\n", and back: a lease read for another boot
  // (the machine restarted: the monotonic clock began again) or one that does not parse
  // is none.
  std::string to_text(const std::string& boot_id) const;
  static std::optional<MachineLease> from_text(std::string_view text, const std::string& boot_id);

 private:
  uint64_t lease_us_ = 0, fence_after_us_ = 0;
  uint64_t renewed_from_ = 0;
};

}  // namespace weft::agent
