#include "agent/range_pool.h"

namespace weft::agent {

std::optional<uint64_t> RangePool::next_free() const {
  if (last_ < first_) return std::nullopt;
  uint64_t span = last_ - first_ + 1;
  uint64_t start = next_ < first_ || next_ > last_ ? first_ : next_;
  for (uint64_t i = 0; i < span; ++i) {
    uint64_t candidate = first_ + (start - first_ + i) % span;
    if (!owners_.count(candidate)) return candidate;
  }
  return std::nullopt;
}

std::optional<uint64_t> RangePool::take(const std::string& owner) {
  if (auto it = by_owner_.find(owner); it != by_owner_.end()) return it->second;
  auto n = next_free();
  if (!n) return std::nullopt;
  owners_[*n] = owner;
  by_owner_[owner] = *n;
  advance_past(*n);
  return n;
}

bool RangePool::hold(uint64_t n, const std::string& owner) {
  if (n < first_ || n > last_) return false;
  auto it = owners_.find(n);
  if (it != owners_.end()) return it->second == owner;
  if (by_owner_.count(owner)) return false;
  owners_[n] = owner;
  by_owner_[owner] = n;
  if (n >= next_) advance_past(n);
  return true;
}

void RangePool::release(const std::string& owner) {
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) return;
  owners_.erase(it->second);
  by_owner_.erase(it);
}

}  // namespace weft::agent
