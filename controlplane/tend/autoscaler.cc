#include "controlplane/tend/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace weft::cp {

namespace {

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

std::string duration(uint64_t us) {
  uint64_t s = us / 1'000'000;
  if (s % 3600 == 0 && s >= 3600) return std::to_string(s / 3600) + "h";
  if (s % 60 == 0 && s >= 60) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

}  // namespace

Autoscaler::Autoscaler(AutoscalePolicy p) : p_(p) {
  p_.min = std::max<int64_t>(p_.min, 0);
  p_.max = std::max(p_.max, p_.min);
  p_.history_days = std::clamp(p_.history_days, 1, 35);
}

void Autoscaler::observe(uint64_t now_us, double total, int64_t ready) {
  if (ready <= 0 || !std::isfinite(total) || total < 0) return;
  last_ = {total, ready};
  auto index = static_cast<uint32_t>(now_us / kSlotUs);
  if (!slots_.empty() && index < slots_.back().index) return;  // the clock went back
  if (slots_.empty() || slots_.back().index != index) slots_.push_back(Slot{index, 0, 0});
  Slot& s = slots_.back();
  ++s.n;
  s.mean += static_cast<float>((total - s.mean) / s.n);
  const uint64_t kept = static_cast<uint64_t>(p_.history_days) * (kDayUs / kSlotUs);
  while (!slots_.empty() && slots_.front().index + kept <= index) slots_.pop_front();
}

nlohmann::json Autoscaler::recent_json() const {
  using nlohmann::json;
  json recs = json::array(), changes = json::array();
  for (const auto& [at, n] : recommendations_) recs.push_back({at, n});
  for (const auto& [at, d] : changes_) changes.push_back({at, d});
  return {{"last", last_ ? json{last_->first, last_->second} : json()},
          {"recommendations", recs},
          {"changes", changes}};
}

nlohmann::json Autoscaler::history_json() const {
  nlohmann::json slots = nlohmann::json::array();
  for (const Slot& s : slots_) slots.push_back({s.index, s.n, s.mean});
  return {{"slots", slots}};
}

void Autoscaler::restore(const nlohmann::json& recent, const nlohmann::json& history) {
  using nlohmann::json;
  // A whole number not below 0 (parsed text holds them unsigned, a built value signed).
  auto whole = [](const json& v) {
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  };
  // [a, b] with a an unsigned integer and b a number of the kind `second` accepts.
  auto pair = [&whole](const json& v, auto second) {
    return v.is_array() && v.size() == 2 && whole(v[0]) && second(v[1]);
  };
  auto integer = [](const json& v) { return v.is_number_integer(); };
  auto number = [](const json& v) { return v.is_number() && std::isfinite(v.get<double>()); };
  // In time order only (a list out of order is not one this wrote).
  auto timed = [&](const json& list, std::deque<std::pair<uint64_t, int64_t>>* out) {
    out->clear();
    if (!list.is_array()) return;
    for (const auto& v : list)
      if (pair(v, integer) && (out->empty() || v[0].get<uint64_t>() >= out->back().first))
        out->emplace_back(v[0].get<uint64_t>(), v[1].get<int64_t>());
  };
  if (recent.is_object()) {
    if (auto l = recent.find("last"); l != recent.end() && l->is_array() && l->size() == 2 &&
                                      number((*l)[0]) && (*l)[1].is_number_integer() &&
                                      (*l)[0].get<double>() >= 0 && (*l)[1].get<int64_t>() > 0)
      last_ = {(*l)[0].get<double>(), (*l)[1].get<int64_t>()};
    if (auto r = recent.find("recommendations"); r != recent.end()) timed(*r, &recommendations_);
    if (auto c = recent.find("changes"); c != recent.end()) timed(*c, &changes_);
  }
  if (history.is_object())
    if (auto list = history.find("slots"); list != history.end() && list->is_array()) {
      slots_.clear();
      for (const auto& v : *list) {
        if (!v.is_array() || v.size() != 3 || !whole(v[0]) || !whole(v[1]) || !number(v[2]) ||
            v[0].get<uint64_t>() > UINT32_MAX || v[1].get<uint64_t>() > UINT32_MAX)
          continue;
        auto index = static_cast<uint32_t>(v[0].get<uint64_t>());
        if (!slots_.empty() && index <= slots_.back().index) continue;
        slots_.push_back(Slot{index, static_cast<uint32_t>(v[1].get<uint64_t>()),
                              static_cast<float>(v[2].get<double>())});
      }
      const uint64_t kept = static_cast<uint64_t>(p_.history_days) * (kDayUs / kSlotUs);
      while (slots_.size() > kept) slots_.pop_front();
    }
}

const Autoscaler::Slot* Autoscaler::slot(uint64_t index) const {
  auto it = std::lower_bound(slots_.begin(), slots_.end(), index,
                             [](const Slot& s, uint64_t i) { return s.index < i; });
  return it != slots_.end() && it->index == index ? &*it : nullptr;
}

std::optional<double> Autoscaler::mean_over(uint64_t from_us, uint64_t to_us) const {
  double sum = 0;
  int n = 0;
  for (uint64_t i = from_us / kSlotUs; i * kSlotUs < to_us; ++i)
    if (const Slot* s = slot(i)) {
      sum += s->mean;
      ++n;
    }
  if (n == 0) return std::nullopt;
  return sum / n;
}

std::optional<double> Autoscaler::predict(uint64_t at_us) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t now = (static_cast<uint64_t>(slots_.back().index) + 1) * kSlotUs;
  const uint64_t hour = 3'600'000'000;
  // The same time a week ago when it is known (a Monday morning is not a Sunday's), else
  // a day ago; each as the mean of the slot and its neighbours.
  for (uint64_t back : {7 * kDayUs, kDayUs}) {
    if (at_us < back + kSlotUs || now < back + hour) continue;
    auto then = mean_over(at_us - back - kSlotUs, at_us - back + 2 * kSlotUs);
    if (!then) continue;
    // The level now against the level then, over the last hour: a service that grew
    // since keeps its shape at its new size (within a factor of two either way).
    auto recent = mean_over(now - hour, now);
    auto recent_then = mean_over(now - hour - back, now - back);
    double factor = 1;
    if (recent && recent_then && *recent_then > 0)
      factor = std::clamp(*recent / *recent_then, 0.5, 2.0);
    return *then * factor;
  }
  return std::nullopt;
}

std::string Autoscaler::horizon() const {
  return p_.lead_us ? "in the next " + duration(p_.lead_us) : "for this time of day";
}

int64_t Autoscaler::replicas_for(double total) const {
  if (p_.target <= 0) return p_.max;
  return static_cast<int64_t>(std::ceil(total / p_.target - 1e-9));
}

AutoscaleDecision Autoscaler::decide(uint64_t now_us, int64_t current, int64_t cap) {
  AutoscaleDecision d;
  std::string why;
  // The proportional rule, within its tolerance.
  int64_t prop = current;
  if (last_) {
    auto [total, ready] = *last_;
    double per_task = total / static_cast<double>(ready);
    double ratio = p_.target > 0 ? per_task / p_.target : 1;
    if (std::abs(ratio - 1) > p_.tolerance) prop = replicas_for(total);
    why = "load " + fmt(per_task) + " a task against a target of " + fmt(p_.target) + " (" +
          std::to_string(ready) + " ready)";
  } else {
    why = "no load reported yet";
  }
  d.proportional = prop;
  uint64_t keep = std::max(p_.up_window_us, p_.down_window_us);
  recommendations_.emplace_back(now_us, prop);
  while (!recommendations_.empty() && recommendations_.front().first + keep < now_us)
    recommendations_.pop_front();
  auto extreme_since = [&](uint64_t window, bool lowest) {
    int64_t v = prop;
    for (const auto& [at, r] : recommendations_)
      if (at + window >= now_us) v = lowest ? std::min(v, r) : std::max(v, r);
    return v;
  };
  // The forecast's peak over the next `lead`, slot by slot.
  std::optional<int64_t> ahead;
  if (p_.predictive) {
    std::optional<double> peak;
    for (uint64_t t = now_us; t <= now_us + p_.lead_us; t += kSlotUs)
      if (auto f = predict(t)) peak = std::max(peak.value_or(0), *f);
    if (peak) {
      // With half the tolerance as headroom: a forecast is a mean the load's noise
      // exceeds (bench/autoscale_week: none, 5% or 10% of headroom; docs/benchmarks.md).
      ahead = replicas_for(*peak * (1 + p_.tolerance / 2));
      d.predicted = ahead;
    }
  }
  int64_t desired = current;
  std::string held;
  if (prop > current) {
    desired = std::max(current, extreme_since(p_.up_window_us, true));
    if (desired < prop)
      held = "; held at " + std::to_string(desired) + " by the scale-up window (" +
             duration(p_.up_window_us) + ")";
  } else if (prop < current) {
    // Down only as far as what the last `down_window` asked and, with a forecast, the
    // load predicted over the next `lead` allow.
    int64_t floor = extreme_since(p_.down_window_us, false);
    if (ahead) floor = std::max(floor, *ahead);
    desired = std::min(current, floor);
    if (desired > prop)
      held = ahead && *ahead >= desired
                 ? "; held at " + std::to_string(desired) + " by the load predicted " + horizon()
                 : "; held at " + std::to_string(desired) + " by the scale-down window (" +
                       duration(p_.down_window_us) + ")";
  }
  if (ahead && *ahead > desired) {
    desired = *ahead;
    held += "; " + std::to_string(*ahead) + " for the load predicted " + horizon();
  }
  // Rate limits over the last period.
  while (!changes_.empty() && changes_.front().first + p_.rate_period_us <= now_us)
    changes_.pop_front();
  int64_t added = 0, removed = 0;
  for (const auto& [at, delta] : changes_) (delta > 0 ? added : removed) += std::abs(delta);
  // As HPA's policies: relative to the size at the start of the period.
  const int64_t base = std::max<int64_t>(current - added + removed, 0);
  std::string limited;
  if (desired > current) {
    int64_t allowed = std::max(p_.up_step, static_cast<int64_t>(p_.up_fraction * base)) - added;
    if (desired - current > allowed) {
      desired = current + std::max<int64_t>(allowed, 0);
      limited = "; limited by the scale-up rate (" + duration(p_.rate_period_us) + ")";
    }
  } else if (desired < current) {
    int64_t allowed =
        std::max(p_.down_step, static_cast<int64_t>(p_.down_fraction * base)) - removed;
    if (current - desired > allowed) {
      desired = current - std::max<int64_t>(allowed, 0);
      limited = "; limited by the scale-down rate (" + duration(p_.rate_period_us) + ")";
    }
  }
  // Bounds: the quota wins over min.
  int64_t hi = std::min(p_.max, std::max<int64_t>(cap, 0));
  int64_t lo = std::min(p_.min, hi);
  std::string bound;
  if (desired > hi) {
    desired = hi;
    bound = hi == p_.max ? "; at max " + std::to_string(hi)
                         : "; at " + std::to_string(hi) + ", what the entitlement's quota leaves";
  } else if (desired < lo) {
    desired = lo;
    bound = "; at min " + std::to_string(lo);
  }
  d.desired = desired;
  d.reason = why + ": " + std::to_string(current) + " -> " + std::to_string(desired) + held +
             limited + bound;
  return d;
}

void Autoscaler::changed(uint64_t now_us, int64_t from, int64_t to) {
  if (to != from) changes_.emplace_back(now_us, to - from);
}

}  // namespace weft::cp
