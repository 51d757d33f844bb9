// Autoscaling's decisions for one job (Twine's Service Resource Manager; Kubernetes'
// HorizontalPodAutoscaler is the baseline an operator will compare with): how many tasks
// the job should have, from its load and its own history, and why.
//
//  - The proportional rule (HPA's): the load summed over the job's ready tasks, divided
//    by the target per task, rounded up; no change while the load per task is within
//    `tolerance` of the target (10%).
//  - Stabilisation windows: the job grows to the lowest recommendation of the last
//    `up_window` (none by default: at once) and shrinks only to the highest of the last
//    `down_window` (5 minutes), so a dip does not cost tasks that the next minute needs,
//    and the direction changes at most once a window.
//  - Rate limits: at most max(`up_step` tasks, `up_fraction` of the job) more, and
//    max(`down_step`, `down_fraction`) fewer, in any `rate_period` (15 s).
//  - Prediction (`predictive`): the job's load is kept per 5-minute slot for up to
//    `history_days`; the load of now (and `lead` ahead) is taken from the same slot a week ago when
//    a week is known (weekday and weekend differ), else a day ago, scaled by how the last hour
//    compares with that same hour then. The job is grown to it before it comes (Twine's SRM scales
//    up ahead of the morning peak); it never shrinks the job below what the proportional rule asks.
//  - Bounds: never below `min`, never above `max` or what the entitlement's quota leaves
//    for the job (`cap`); the quota wins over `min`.
//
// Pure: fed the time, the load and the job's size; the control plane acts on decide()'s
// answer (through the job's TaskController and the discovery drain when it shrinks).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::cp {

struct AutoscalePolicy {
  int64_t min = 1, max = 1;
  double target = 0.5;      // the load per ready task to run at (CPU cores, MiB, the app's metric)
  double tolerance = 0.10;  // no change while |load per task / target - 1| <= this
  uint64_t up_window_us = 0;
  uint64_t down_window_us = 300'000'000;
  uint64_t rate_period_us = 15'000'000;
  int64_t up_step = 4;
  double up_fraction = 1.0;
  int64_t down_step = 0;
  double down_fraction = 1.0;
  bool predictive = false;
  // How far ahead the prediction looks beyond the current 5-minute slot, whose forecast
  // (the slot and its neighbours a week ago: the last 5 and the next 10 minutes) already
  // leads. Looking further cost more task-hours than it saved time under target
  // (bench/autoscale_week: 15 minutes 1.014x the task-hours, none 0.996x).
  uint64_t lead_us = 0;
  int history_days = 8;  // a week and a day: the same weekday, and yesterday
};

struct AutoscaleDecision {
  int64_t desired = 0;               // what the job should have now (the current size: no change)
  int64_t proportional = 0;          // what the proportional rule asked, before windows and limits
  std::optional<int64_t> predicted;  // what the prediction asked, when it had history
  std::string reason;                // for the job's event: what, from what, and what limited it
};

class Autoscaler {
 public:
  static constexpr uint64_t kSlotUs = 300'000'000;  // history slots of 5 minutes
  static constexpr uint64_t kDayUs = 86'400'000'000;

  explicit Autoscaler(AutoscalePolicy p);

  // A sample of the job's load: the metric summed over its ready tasks, and how many
  // were ready. Samples without a ready task carry no load figure and are not kept.
  void observe(uint64_t now_us, double total, int64_t ready);
  // The size the job should have now, given its current size and the most the quota
  // leaves for it. A change is remembered for the rate limits: call changed() once it
  // was made.
  AutoscaleDecision decide(uint64_t now_us, int64_t current, int64_t cap);
  void changed(uint64_t now_us, int64_t from, int64_t to);

  // The load predicted for `at_us` from the history, or none yet.
  std::optional<double> predict(uint64_t at_us) const;
  const AutoscalePolicy& policy() const { return p_; }
  size_t slots_kept() const { return slots_.size(); }

  // Its state for the next leader (AutoscaleRounds' notes), in two parts: what the
  // windows and rate limits need (the latest sample, recommendations and changes: small,
  // changed every round) and the load history (the slots: written as a slot begins).
  // Times are the wall clock's, as decide() and observe() are given.
  nlohmann::json recent_json() const;
  nlohmann::json history_json() const;
  uint32_t newest_slot() const { return slots_.empty() ? 0 : slots_.back().index; }
  // Back from those (either may be null); what is not well formed is left out.
  void restore(const nlohmann::json& recent, const nlohmann::json& history);

 private:
  // 12 bytes a slot: 2,304 slots (27 KiB) for 8 days of a job's history.
  struct Slot {
    uint32_t index = 0;  // at_us / kSlotUs
    uint32_t n = 0;
    float mean = 0;
  };
  const Slot* slot(uint64_t index) const;
  // The mean load over [from, to) from the slots, or none without any.
  std::optional<double> mean_over(uint64_t from_us, uint64_t to_us) const;
  int64_t replicas_for(double total) const;
  std::string horizon() const;  // "in the next 15m", "for this time of day"

  AutoscalePolicy p_;
  std::optional<std::pair<double, int64_t>> last_;            // the latest sample: load, ready
  std::deque<Slot> slots_;                                    // oldest first, at most history_days
  std::deque<std::pair<uint64_t, int64_t>> recommendations_;  // (when, proportional)
  std::deque<std::pair<uint64_t, int64_t>> changes_;          // (when, signed change)
};

}  // namespace weft::cp
