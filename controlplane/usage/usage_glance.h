// What tasks use, for the web view (web_view.h, docs/web-view.md): `top`'s rows by job
// and by machine, asked of the agents in the background while pages are being looked at.
// A page is rendered from the state the control plane has and never waits for a machine:
// it shows the last answer and its age, and asks for a new one when that is older than
// kFresh (one round at a time, each bounded by kTimeout, as `weftctl top`'s). Nobody
// looking (no page for kIdle), nothing is asked.
#pragma once

#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/usage/agent_asks.h"

namespace weft::cp {

class UsageGlance {
 public:
  static constexpr uint64_t kFresh = 10'000'000;
  static constexpr uint64_t kTimeout = 3'000'000;

  UsageGlance(AgentAsks& asks, const Allocator& alloc, const Scheduler& sched)
      : asks_(asks), alloc_(alloc), sched_(sched) {}
  ~UsageGlance() { *alive_ = false; }
  UsageGlance(const UsageGlance&) = delete;
  UsageGlance& operator=(const UsageGlance&) = delete;

  // For a page at `now_us` (CLOCK_MONOTONIC): {"jobs": top rows, "machines": top rows,
  // "age_s", "silent"}, or null before the first answer; a round starts when the last
  // answer is older than kFresh.
  nlohmann::json glance(uint64_t now_us);

 private:
  AgentAsks& asks_;
  const Allocator& alloc_;
  const Scheduler& sched_;
  nlohmann::json last_;  // null until the first answer
  uint64_t answered_us_ = 0;
  bool asking_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace weft::cp
