// One machine's ports as the allocator books them (docs/services.md): the fixed ports its
// tasks claim, the range the ports a job leaves to the control plane come from (the
// agent's port_range), and the machine's own ports (its listeners, weft's, its
// reserved_ports), which no task gets. Counted so that whether a task's ports fit is a
// subtraction, not a walk of the range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace weft::cp {

class MachinePorts {
 public:
  // The range and the machine's own ports (a machine registering again may change both).
  void set(uint16_t first, uint16_t last, const std::vector<uint16_t>& reserved);
  bool claimed(uint16_t p) const { return claimed_.count(p) > 0; }
  // Claimed by a task or the machine's own.
  bool taken(uint16_t p) const { return claimed(p) || reserved_.count(p) > 0; }
  void claim(uint16_t p) {
    if (claimed_.insert(p).second && in_range(p)) ++in_range_;
  }
  void release(uint16_t p) {
    if (claimed_.erase(p) && in_range(p)) --in_range_;
  }
  // Whether one more task with these fixed ports and `dynamic` ports of the range fits,
  // beside `taken` tasks of its job already here (a fixed port: one task a machine).
  bool fit(const std::vector<uint16_t>& fixed, int dynamic, int taken) const;
  // `want` free ports of the range, claimed, taken in turn from where the last search
  // stopped (a port just let go is the last to be handed out again: a client of the old
  // task may still try it). Fewer when the range has fewer free.
  std::vector<uint16_t> take(size_t want);

 private:
  bool in_range(uint16_t p) const { return p >= first_ && p <= last_; }
  uint16_t first_ = 20000, last_ = 32767;
  std::unordered_set<uint16_t> claimed_, reserved_;
  uint32_t in_range_ = 0;           // claimed ports in the range
  uint32_t reserved_in_range_ = 0;  // the machine's own in the range, not claimed
  uint16_t next_ = 0;               // where the next search of the range starts
};

}  // namespace weft::cp
