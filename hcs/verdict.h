// Health verdicts with hysteresis, so a probe never flaps.
//
// Each probe reports a sample (ok, degraded, failed, unknown). Its state enters FAILED
// only after `fail_after` consecutive failed samples, and leaves it only after
// `recover_after` consecutive good ones *and* a hold-down since it entered. A probe that
// changed state more than `flap_limit` times within `flap_window` is pinned at DEGRADED
// until it has been stable for a whole window. UNKNOWN is never read as OK: the machine's
// verdict is the worst probe state, with UNKNOWN worse than OK and DEGRADED. Pure
// logic: the caller supplies the time.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace weft::hcs {

enum class Health { kOk = 0, kDegraded = 1, kUnknown = 2, kFailed = 3 };
const char* health_name(Health h);
Health health_from_name(const std::string& s);

struct Hysteresis {
  int fail_after = 3;
  int recover_after = 3;
  uint64_t hold_down_us = 30'000'000;
  int flap_limit = 4;
  uint64_t flap_window_us = 600'000'000;
};

class ProbeState {
 public:
  explicit ProbeState(Hysteresis h = {}) : h_(h) {}
  // Feeds one sample; returns true when the reported state changed.
  bool sample(Health s, uint64_t now_us, const std::string& detail = "");
  // The reported state: the hysteresis state, shown as DEGRADED instead of OK while pinned.
  Health state() const;
  bool pinned() const { return pinned_; }
  const std::string& detail() const { return detail_; }
  uint64_t since_us() const { return since_us_; }
  nlohmann::json to_json() const;
  static ProbeState from_json(const nlohmann::json& j, Hysteresis h);

 private:
  void set(Health s, uint64_t now_us);
  Hysteresis h_;
  Health state_ = Health::kUnknown;
  uint64_t since_us_ = 0;
  int bad_run_ = 0, good_run_ = 0;
  std::deque<uint64_t> transitions_;
  bool pinned_ = false;
  std::string detail_;
};

// The machine's verdict: the worst state among probes (none -> UNKNOWN).
Health machine_verdict(const std::map<std::string, ProbeState>& probes);

}  // namespace weft::hcs
