#include "hcs/verdict.h"

#include <algorithm>

namespace weft::hcs {

const char* health_name(Health h) {
  switch (h) {
    case Health::kOk:
      return "ok";
    case Health::kDegraded:
      return "degraded";
    case Health::kUnknown:
      return "unknown";
    case Health::kFailed:
      return "failed";
  }
  return "unknown";
}

Health health_from_name(const std::string& s) {
  if (s == "ok") return Health::kOk;
  if (s == "degraded") return Health::kDegraded;
  if (s == "failed") return Health::kFailed;
  return Health::kUnknown;
}

Health ProbeState::state() const {
  return pinned_ && state_ == Health::kOk ? Health::kDegraded : state_;
}

void ProbeState::set(Health s, uint64_t now_us) {
  if (s == state_) return;
  state_ = s;
  since_us_ = now_us;
  transitions_.push_back(now_us);
}

bool ProbeState::sample(Health s, uint64_t now_us, const std::string& detail) {
  Health shown_before = state();
  detail_ = detail;
  while (!transitions_.empty() && now_us - transitions_.front() > h_.flap_window_us)
    transitions_.pop_front();

  bad_run_ = s == Health::kFailed ? bad_run_ + 1 : 0;
  // Recovery counts samples that are no longer failed: a link that is back but flapping
  // leaves FAILED for DEGRADED rather than staying FAILED while it works.
  good_run_ = s == Health::kOk || s == Health::kDegraded ? good_run_ + 1 : 0;

  if (state_ == Health::kFailed) {
    // Leaving FAILED needs a run of good samples and the hold-down since entering it.
    if (good_run_ >= h_.recover_after && now_us - since_us_ >= h_.hold_down_us) set(s, now_us);
  } else if (bad_run_ >= h_.fail_after) {
    set(Health::kFailed, now_us);
  } else if (s != Health::kFailed) {
    set(s, now_us);
  }
  // A failed sample short of fail_after changes nothing: one bad sample is not a verdict.

  // Too many transitions within the window: never shown better than DEGRADED until a
  // whole window passes without one.
  if (static_cast<int>(transitions_.size()) > h_.flap_limit)
    pinned_ = true;
  else if (transitions_.empty())
    pinned_ = false;
  return state() != shown_before;
}

nlohmann::json ProbeState::to_json() const {
  nlohmann::json tr = nlohmann::json::array();
  for (uint64_t t : transitions_) tr.push_back(t);
  return {{"state", health_name(state())},
          {"raw_state", health_name(state_)},
          {"since_us", since_us_},
          {"bad_run", bad_run_},
          {"good_run", good_run_},
          {"pinned", pinned_},
          {"detail", detail_},
          {"transitions", tr}};
}

ProbeState ProbeState::from_json(const nlohmann::json& j, Hysteresis h) {
  ProbeState p(h);
  p.state_ = health_from_name(j.value("raw_state", j.value("state", "unknown")));
  p.since_us_ = j.value("since_us", uint64_t{0});
  p.bad_run_ = j.value("bad_run", 0);
  p.good_run_ = j.value("good_run", 0);
  p.pinned_ = j.value("pinned", false);
  p.detail_ = j.value("detail", "");
  if (j.contains("transitions") && j["transitions"].is_array())
    for (const auto& t : j["transitions"]) p.transitions_.push_back(t.get<uint64_t>());
  return p;
}

Health machine_verdict(const std::map<std::string, ProbeState>& probes) {
  if (probes.empty()) return Health::kUnknown;
  Health worst = Health::kOk;
  for (const auto& [name, p] : probes) worst = std::max(worst, p.state());
  return worst;
}

}  // namespace weft::hcs
