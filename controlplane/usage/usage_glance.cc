#include "controlplane/usage/usage_glance.h"

#include "common/clock.h"
#include "controlplane/usage/top.h"

namespace weft::cp {

using json = nlohmann::json;

json UsageGlance::glance(uint64_t now_us) {
  if (!asking_ && (last_.is_null() || now_us - answered_us_ >= kFresh)) {
    asking_ = true;
    TopQuery all;
    std::weak_ptr<bool> alive = alive_;
    asks_.usage(top_asks(all, alloc_, sched_), kTimeout, [this, alive](AgentAsks::Answer a) {
      if (!alive.lock()) return;
      asking_ = false;
      TopQuery jobs, machines;
      machines.of = TopQuery::Of::kMachines;
      json j = top_json(jobs, a, alloc_, sched_);
      json m = top_json(machines, a, alloc_, sched_);
      last_ = json{{"jobs", j["rows"]}, {"machines", m["rows"]}, {"silent", j["silent"]}};
      answered_us_ = now_monotonic_us();
    });
  }
  if (last_.is_null()) return json();
  json out = last_;
  out["age_s"] = (now_us - std::min(now_us, answered_us_)) / 1'000'000;
  return out;
}

}  // namespace weft::cp
