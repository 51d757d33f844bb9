// The agent's Prometheus /metrics (docs/metrics.md): its tasks by state, starts and their
// latency, restarts, OOM kills, sandbox handoffs, and what its parts count.
#pragma once

#include <cstdint>
#include <memory>

#include "common/metrics.h"

namespace weft::agent {

class Manager;

class AgentMetrics {
 public:
  explicit AgentMetrics(Manager& m) : m_(m) {}
  // Prometheus /metrics (docs/metrics.md).
  void register_metrics();

 private:
  friend class Manager;
  Manager& m_;
  metrics::Registry metrics_;
  std::unique_ptr<metrics::HttpServer> metrics_http_;
  metrics::Histogram start_seconds_;
  uint64_t starts_ = 0, restarts_ = 0, oom_kills_ = 0;
  uint64_t handoffs_ = 0;        // starts that took a sandbox
  uint64_t store_failures_ = 0;  // task records not written (a full or failing disk)
};

}  // namespace weft::agent
