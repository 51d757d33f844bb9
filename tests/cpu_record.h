// A cgroup's own CPU counter (cpu.stat's usage_usec) recorded every 50 ms: what a usage
// figure measured over an interval (task.usage, top) is checked against, over the same
// span of time (a loaded machine's rate changes from second to second, so a mean would
// not do).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/fs.h"

namespace weft::testing {

class CpuRecord {
 public:
  explicit CpuRecord(std::string cgroup)
      : cgroup_(std::move(cgroup)), t0_(std::chrono::steady_clock::now()) {}
  uint64_t usec() const {
    std::string stat = read_file(cgroup_ + "/cpu.stat").value_or("");
    size_t at = stat.find("usage_usec ");
    return at == std::string::npos ? 0 : std::stoull(stat.substr(at + 11));
  }
  void sample() { record_.emplace_back(seconds(), usec()); }
  // Samples every 50 ms for `span` seconds.
  void record_for(double span) {
    double until = seconds() + span;
    while (seconds() < until) {
      sample();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Over the whole record, in thousandths of a core.
  double mean_millicores() const {
    if (record_.size() < 2) return 0;
    return static_cast<double>(record_.back().second - record_.front().second) /
           (record_.back().first - record_.front().first) / 1000.0;
  }
  // The smallest difference between `reported` (thousandths of a core) and the counter's
  // rate over a span of `interval` seconds (±10%) in the record.
  double closest(double reported, double interval) const {
    double best = 1e18;
    for (size_t i = 0; i < record_.size(); ++i)
      for (size_t j = i + 1; j < record_.size(); ++j) {
        double span = record_[j].first - record_[i].first;
        if (span < 0.9 * interval || span > 1.1 * interval) continue;
        double rate = static_cast<double>(record_[j].second - record_[i].second) / span / 1000.0;
        best = std::min(best, std::abs(rate - reported));
      }
    return best;
  }

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  std::string cgroup_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<std::pair<double, uint64_t>> record_;  // (seconds, usage_usec)
};

}  // namespace weft::testing
