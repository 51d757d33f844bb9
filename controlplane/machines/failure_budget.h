// How much damage failures may cause before a human looks: Twine's rate limits on
// destructive work, and the circuit breaker.
//
//  - TokenBucket: `per_min` tokens a minute, up to `burst`, full when first used. The
//    scheduler spends one per destructive act a failure causes (a task replaced or
//    stopped: SchedulerLimits::destructive_*), the failure budget one per fault domain
//    whose machines went down together.
//  - FailureBudget: machines that went down wait, oldest first, for a token before their
//    tasks are replaced elsewhere (cp_conf.h machine_failures_*; the burst grows with
//    the fleet). While more than `breaker` of a fleet of ten or more is down at once,
//    nothing is replaced: that is more likely the control plane's own network than the
//    fleet, and moving everything would make it worse.
// Pure: fed the time, the fleet's size and what each machine is now.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

class TokenBucket {
 public:
  TokenBucket(double per_min, double burst) : per_min_(per_min), burst_(burst) {}
  // The burst from now on (the tokens held are capped at the next refill).
  void set_burst(double burst) { burst_ = burst; }
  // Takes a token if one is there.
  bool take(uint64_t now_us);
  // Whether one is there, without taking it.
  bool peek(uint64_t now_us);
  double tokens() const { return tokens_; }

 private:
  void refill(uint64_t now_us);
  double per_min_, burst_;
  double tokens_ = -1;  // < 0: not used yet (full at first use)
  uint64_t at_us_ = 0;
};

class FailureBudget {
 public:
  struct Limits {
    double per_min = 60;           // fault domains' machines replaced a minute
    double burst_fraction = 0.01;  // of the fleet (at least 20)
    double breaker = 0.3;          // of the fleet down at once: nothing is replaced
  };
  explicit FailureBudget(Limits l) : limits_(l), bucket_(l.per_min, 20) {}

  // A machine went down: its tasks wait for the budget.
  void went_down(MachineId m) { waiting_.push_back(m); }
  // Every waiting machine counts as down for the breaker (once a tick).
  void count_waiting() { down_.insert(waiting_.begin(), waiting_.end()); }
  // A machine is back (ready again): it no longer counts as down.
  void back(MachineId m) { down_.erase(m); }

  struct Step {
    std::vector<MachineId> replace;  // their tasks are replaced now
    bool breaker_opened = false;     // the breaker opened at this step (or is open, and
                                     // was last reported more than 30 s ago)
    bool breaker_closed = false;     // it closed at this step
  };
  // `still_down(m)`: dead or failed now (a machine back meanwhile leaves the queue);
  // `domain(m)`: its fault domain (machines of one domain that went down together take
  // one token between them).
  Step step(uint64_t now_us, size_t fleet, const std::function<bool(MachineId)>& still_down,
            const std::function<std::string(MachineId)>& domain);

  size_t waiting() const { return waiting_.size(); }
  size_t down() const { return down_.size(); }
  bool breaker_open() const { return breaker_open_; }

 private:
  Limits limits_;
  TokenBucket bucket_;
  std::deque<MachineId> waiting_;  // oldest first
  std::set<MachineId> down_;       // every machine down now (for the breaker)
  bool breaker_open_ = false;
  uint64_t breaker_reported_us_ = 0;
};

}  // namespace weft::cp
