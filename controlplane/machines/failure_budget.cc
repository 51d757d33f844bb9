#include "controlplane/machines/failure_budget.h"

#include <algorithm>
#include <map>

namespace weft::cp {

void TokenBucket::refill(uint64_t now) {
  if (tokens_ < 0) {
    tokens_ = burst_;
    at_us_ = now;
  }
  double rate = per_min_ / 60e6;  // tokens per µs
  if (now > at_us_) tokens_ = std::min(burst_, tokens_ + rate * static_cast<double>(now - at_us_));
  at_us_ = now;
}

bool TokenBucket::take(uint64_t now) {
  refill(now);
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

bool TokenBucket::peek(uint64_t now) {
  refill(now);
  return tokens_ >= 1;
}

FailureBudget::Step FailureBudget::step(uint64_t now, size_t fleet,
                                        const std::function<bool(MachineId)>& still_down,
                                        const std::function<std::string(MachineId)>& domain) {
  Step out;
  if (waiting_.empty()) return out;
  std::erase_if(down_, [&](MachineId m) { return !still_down(m); });  // back since
  if (fleet >= 10 &&
      static_cast<double>(down_.size()) > limits_.breaker * static_cast<double>(fleet)) {
    if (!breaker_open_ || now - breaker_reported_us_ > 30'000'000) {
      out.breaker_opened = true;
      breaker_reported_us_ = now;
    }
    breaker_open_ = true;
    return out;
  }
  out.breaker_closed = std::exchange(breaker_open_, false);
  bucket_.set_burst(std::max(20.0, limits_.burst_fraction * static_cast<double>(fleet)));
  std::deque<MachineId> left;
  std::map<std::string, bool> paid;  // domain -> token taken (true) or refused (false)
  for (MachineId m : waiting_) {
    if (!still_down(m)) continue;  // back meanwhile
    std::string d = domain(m);
    auto it = paid.find(d);
    if (it == paid.end()) it = paid.emplace(d, bucket_.take(now)).first;
    if (!it->second) {
      left.push_back(m);
      continue;
    }
    out.replace.push_back(m);
  }
  waiting_ = std::move(left);
  return out;
}

}  // namespace weft::cp
