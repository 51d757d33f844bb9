// Which control-plane replica a machine daemon tries next, and how long it waits first
// (ControlPlaneLink, cp_link.h). Pure: no sockets, no clock; the link tells it what
// happened and asks it for the next endpoint and delay.
//
// Several endpoints (replicas) are tried in turn, 100 ms apart; a follower's "not the
// leader" answer sends the next try to the leader it names (at once, if that is one of
// ours). Only a whole round without a leader grows the backoff: 0.5 s doubling to 30 s,
// or to 2 s while a follower answered (an election is under way: the new leader is a
// lease TTL away), jittered by up to a quarter so that a fleet that lost its leader
// together does not come back in lockstep. A redirect counts as a try, so two followers
// that name each other cannot keep the link spinning. In a region a machine may be held
// by another control plane (moved); a holder that answers nowhere for two rounds gives
// the machine back to the configured endpoints.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace weft {

class EndpointRotation {
 public:
  // `configured`: the endpoints of the daemon's configuration (never empty).
  explicit EndpointRotation(std::vector<std::string> configured, uint32_t seed);

  const std::string& current() const { return endpoints_[current_]; }
  bool held() const { return held_; }
  // The hello was accepted: the backoff and the round start again.
  void accepted();
  // A follower answered; `leader` is where it says the leader is ("" if it does not know).
  void follower_named(const std::string& leader);
  // The machine is held by the control plane at `to` (its replicas, comma-separated), or
  // belongs to the configured endpoints again ("").
  void moved(const std::vector<std::string>& to);
  // The session ended (or never began): moves on to the next endpoint and says how long
  // to wait before trying it, in microseconds.
  uint64_t next_delay_us();

 private:
  std::vector<std::string> endpoints_;
  std::vector<std::string> configured_;  // endpoints_ while no holder was named
  bool held_ = false;                    // endpoints_ are a holder's
  size_t current_ = 0, next_ = 0;
  bool redirected_ = false;
  bool follower_answered_ = false;  // in this round of endpoints
  uint64_t tried_ = 0;              // connections that ended without an accepted hello
  uint64_t backoff_us_ = kFirstBackoffUs;
  std::minstd_rand jitter_;

  static constexpr uint64_t kFirstBackoffUs = 500'000;
};

}  // namespace weft
