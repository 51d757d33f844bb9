// A task's own metric, read from its Prometheus text endpoint (the exposition format,
// version 0.0.4: https://prometheus.io/docs/instrumenting/exposition_formats/) for
// autoscaling on an application metric (docs/jobs.md, "Autoscaling"). A strict reader
// of what a task serves (untrusted bytes): comment and HELP/TYPE lines are skipped,
// every sample line must be well formed (a metric name, an optional label set with
// quoted, escaped values, a value, an optional timestamp), or the whole body is refused
// with the line's number.
#pragma once

#include <cstddef>
#include <string_view>

#include "common/result.h"

namespace weft {

inline constexpr size_t kMaxMetricsBody = 1 << 20;  // what is read of an endpoint
inline constexpr size_t kMaxMetricsLines = 100000;

// The sum of the samples of metric `name` over its label sets (a gauge served per
// worker or per route adds up to the task's). An error when the body is malformed, the
// metric is absent, or a sample is NaN or infinite.
Result<double> prometheus_sum(std::string_view body, std::string_view name);

bool valid_metric_name(std::string_view name);  // [a-zA-Z_:][a-zA-Z0-9_:]*, 1-200 chars

}  // namespace weft
