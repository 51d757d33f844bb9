// Numbers of a range held by owners, handed out in turn: the search for a free one starts
// after the last one handed out, so a number just freed is the last to be handed out
// again (a uid or an address a task just left is not at once another task's, whose
// packets or files the old one's could still meet). Task uids (agent.toml task_uids) and
// bridge addresses (agent/bridge.h) are pools of this kind. Pure; bridge_test.cc and
// range_pool_test.cc test it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace weft::agent {

class RangePool {
 public:
  // The numbers first..last (none when last < first).
  RangePool(uint64_t first, uint64_t last) : first_(first), last_(last), next_(first) {}

  // The number `owner` holds, else the next free one, now held by it; none when every
  // number is held.
  std::optional<uint64_t> take(const std::string& owner);
  // The number take() would hand out now, without holding it.
  std::optional<uint64_t> next_free() const;
  // `owner` holds `n` (a restarted agent's records, or after next_free()). False when
  // `n` is outside the range, another owner holds it, or `owner` holds another.
  bool hold(uint64_t n, const std::string& owner);
  void release(const std::string& owner);

  bool in_use(uint64_t n) const { return owners_.count(n) != 0; }
  size_t held() const { return by_owner_.size(); }
  bool empty_range() const { return last_ < first_; }

 private:
  void advance_past(uint64_t n) { next_ = n >= last_ ? first_ : n + 1; }
  uint64_t first_, last_, next_;
  std::map<uint64_t, std::string> owners_;
  std::map<std::string, uint64_t> by_owner_;
};

}  // namespace weft::agent
