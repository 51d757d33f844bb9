// What a task uses (task.usage, docs/protocol.md): its machine's agent samples each
// task's cgroup every usage_interval and answers with the figures of the last interval,
// compactly (one array of four integers a task), for the control plane's autoscaling and
// for operators (`weftctl job autoscale show`). Shared by weft-agent, which answers, and
// weft-controlplane, which asks.
//
//   request:  {"tasks": ["web.0.12", ...]}            (absent: every task the agent has)
//   answer:   {"interval_ms": 5000,
//              "tasks": {"web.0.12": [cpu_milli, memory_bytes, io_read_Bps, io_write_Bps]}}
//
// A task not sampled yet (started within the interval) or not on the machine is left out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

struct TaskUsage {
  uint64_t cpu_milli = 0;  // CPU time over the interval, in thousandths of a core
  uint64_t mem_bytes = 0;  // memory.current at the latest sample
  uint64_t io_read_bps = 0, io_write_bps = 0;  // bytes a second over the interval
  bool operator==(const TaskUsage&) const = default;
};

struct UsageReport {
  uint64_t interval_ms = 0;
  std::map<std::string, TaskUsage> tasks;
};

inline constexpr size_t kMaxUsageTasks = 100000;

nlohmann::json to_json(const UsageReport& r);
// The one reader of an answer: at most kMaxUsageTasks tasks, each an array of exactly
// four integers from 0 to 2^53; errors name the field ("tasks.web.0.12[1]").
Result<UsageReport> parse_usage_report(const nlohmann::json& j);
// The one reader of a request's params: the task ids asked for (empty: all).
Result<std::vector<std::string>> parse_usage_request(const nlohmann::json& j);

}  // namespace weft
