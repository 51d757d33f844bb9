// The gate group commits hold a daemon's output behind (the control plane's
// store/group_commit.h): what sessions would send waits, by epoch, until the group that
// wrote it is durable.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::rpc {

class Session;

// Group commit (the control plane): while a gate is held, the sessions that share it
// keep what they would send (replies, requests) until release(): a daemon writes many
// calls' changes in one transaction and answers none of them before it is durable.
//
// Pipelined commits (a store that writes off the loop): output is kept by epoch. seal()
// closes the current epoch (what was said so far waits for the group being committed)
// and later output belongs to the next; release_through(e) sends what epochs up to `e`
// said, in order, while the gate stays held for the newer ones.
class OutputGate {
 public:
  void hold() { held_ = true; }
  bool held() const { return held_; }
  // Sends what waited, session by session; the gate is open again.
  void release();
  uint64_t epoch() const { return epoch_; }
  // Output so far belongs to the returned epoch, later output to the next one.
  uint64_t seal() { return epoch_++; }
  // Sends what epochs up to `e` said; the gate stays held.
  void release_through(uint64_t e);

 private:
  friend class Session;
  bool held_ = false;
  uint64_t epoch_ = 1;
  std::vector<Session*> waiting_;
};

}  // namespace weft::rpc
