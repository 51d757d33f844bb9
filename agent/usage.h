// Each task's use of its cgroup, sampled every usage_interval (agent.toml) on the
// agent's loop: CPU and I/O as averages over the last interval, memory as of the last
// sample. task.usage (common/task_usage.h) answers from the last samples, so that any
// number of readers (the control plane's autoscaling, an operator) see the same figures
// and none of them costs a read of the cgroup files.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/cgroup.h"
#include "agent/metric_scrape.h"
#include "common/event.h"
#include "common/task_usage.h"

namespace weft::agent {

class UsageSampler {
 public:
  using Read = std::function<std::optional<UsageCounters>(const std::string& id)>;
  using Ids = std::function<std::vector<std::string>()>;  // the tasks to sample
  UsageSampler(uint64_t interval_us, Read read, Ids ids)
      : interval_us_(interval_us), read_(std::move(read)), ids_(std::move(ids)) {}
  // Samples now and every interval on `loop`.
  Status start(EventLoop& loop);
  // One sample of every task at `now_us` (monotonic): the timer's work, and tests'.
  void sample(uint64_t now_us);
  // The figures of `ids` (empty: every task sampled twice at least).
  UsageReport report(const std::vector<std::string>& ids) const;
  uint64_t interval_ms() const { return interval_us_ / 1000; }
  // `base` with the app metrics of `targets` added (each a fifth figure, or its reason in
  // scrape_errors), given to `reply` once every scrape ended; at most kMaxBatches at once
  // (an error then, at once).
  static constexpr size_t kMaxBatches = 16;
  Status scrape(EventLoop& loop, HttpClient& http, UsageReport base,
                std::vector<ScrapeTarget> targets, std::function<void(UsageReport)> reply);

 private:
  struct Seen {
    uint64_t at_us = 0;
    UsageCounters counters;
    std::optional<TaskUsage> usage;  // from the two latest samples
  };
  uint64_t interval_us_;
  Read read_;
  Ids ids_;
  std::map<std::string, Seen> seen_;
  Source timer_;
  std::map<uint64_t, std::unique_ptr<ScrapeBatch>> batches_;
  uint64_t next_batch_ = 0;
};

}  // namespace weft::agent
