// What a task uses (task.usage, docs/protocol.md): its machine's agent samples each
// task's cgroup every usage_interval and answers with the figures of the last interval,
// compactly (one array of four integers a task), for the control plane's autoscaling and
// for operators (`weftctl job autoscale show`). Shared by weft-agent, which answers, and
// weft-controlplane, which asks.
//
//   request:  {"tasks": ["web.0.12", ...],            (absent: every task the agent has)
//              "scrape": [{"tasks": ["web.0.12"], "port": "http", "path": "/metrics",
//                          "name": "http_in_flight"}]}  (optional: an app metric's tasks)
//   answer:   {"interval_ms": 5000,
//              "tasks": {"web.0.12": [cpu_milli, memory_bytes, io_read_Bps, io_write_Bps,
//                                     metric]},        (metric: when it was scraped)
//              "scrape_errors": {"web.0.12": "connection refused"}}
//
// A task not sampled yet (started within the interval) or not on the machine is left out.
// A scrape is one GET of the task's named port on its own network, bounded by 2 s; the
// metric is its samples summed over their labels (common/prometheus_text.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

struct TaskUsage {
  uint64_t cpu_milli = 0;  // CPU time over the interval, in thousandths of a core
  uint64_t mem_bytes = 0;  // memory.current at the latest sample
  uint64_t io_read_bps = 0, io_write_bps = 0;  // bytes a second over the interval
  std::optional<double> metric;                // the app metric, when scraped
  bool operator==(const TaskUsage&) const = default;
};

struct UsageReport {
  uint64_t interval_ms = 0;
  std::map<std::string, TaskUsage> tasks;
  std::map<std::string, std::string> scrape_errors;  // at most kMaxScrapeErrors
};

// Tasks whose app metric is asked for, and where it is served.
struct ScrapeGroup {
  std::vector<std::string> tasks;
  std::string port;  // a named port of the tasks
  std::string path;
  std::string name;  // the metric
};
struct UsageRequest {
  std::vector<std::string> tasks;  // empty: all
  std::vector<ScrapeGroup> scrape;
};
inline constexpr size_t kMaxScrapeGroups = 64;
inline constexpr size_t kMaxScrapeErrors = 64;
nlohmann::json to_json(const UsageRequest& r);

inline constexpr size_t kMaxUsageTasks = 100000;

nlohmann::json to_json(const UsageReport& r);
// The one reader of an answer: at most kMaxUsageTasks tasks, each an array of exactly
// four integers from 0 to 2^53; errors name the field ("tasks.web.0.12[1]").
Result<UsageReport> parse_usage_report(const nlohmann::json& j);
// The one reader of a request's params.
Result<UsageRequest> parse_usage_request(const nlohmann::json& j);

}  // namespace weft
