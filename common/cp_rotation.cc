#include "common/cp_rotation.h"

#include <algorithm>
#include <utility>

namespace weft {

EndpointRotation::EndpointRotation(std::vector<std::string> configured, uint32_t seed)
    : endpoints_(std::move(configured)), jitter_(seed) {
  if (endpoints_.empty()) endpoints_.emplace_back();
  configured_ = endpoints_;
}

void EndpointRotation::accepted() {
  backoff_us_ = kFirstBackoffUs;
  tried_ = 0;
}

void EndpointRotation::follower_named(const std::string& leader) {
  auto it = std::find(endpoints_.begin(), endpoints_.end(), leader);
  next_ = it != endpoints_.end() ? static_cast<size_t>(it - endpoints_.begin())
                                 : (current_ + 1) % endpoints_.size();
  redirected_ = true;
  follower_answered_ = true;
}

void EndpointRotation::moved(const std::vector<std::string>& to) {
  held_ = !to.empty();
  endpoints_ = held_ ? to : configured_;
  current_ = 0;
  next_ = 0;
  redirected_ = true;
  tried_ = 0;
}

uint64_t EndpointRotation::next_delay_us() {
  uint64_t delay = backoff_us_;
  ++tried_;
  if (held_ && tried_ >= 2 * endpoints_.size()) moved({});
  if (redirected_) {
    current_ = next_;
    redirected_ = false;
  } else {
    current_ = (current_ + 1) % endpoints_.size();
  }
  if (endpoints_.size() > 1 && tried_ % (2 * endpoints_.size()) != 0) return 100'000;
  // A round that found no leader.
  uint64_t cap = std::exchange(follower_answered_, false) ? 2'000'000 : 30'000'000;
  backoff_us_ = std::min<uint64_t>(backoff_us_ * 2, cap);
  delay = std::min(delay, cap);
  return delay + static_cast<uint64_t>(jitter_() % (delay / 4 + 1));
}

}  // namespace weft
