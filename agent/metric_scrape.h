// The app metrics of one task.usage request (common/task_usage.h, "scrape"): one GET of
// each task's named port on its own network (as readiness checks reach it: from inside
// its network namespace when it has one), bounded by kScrapeTimeoutUs, the body read by
// the strict Prometheus text reader (common/prometheus_text.h). The answer waits for all
// of them; destroying the batch cancels what is in flight and its callback never runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/http_client.h"
#include "common/result.h"

namespace weft::agent {

inline constexpr uint64_t kScrapeTimeoutUs = 2'000'000;

struct ScrapeTarget {
  std::string task;  // as the request named it
  uint16_t port = 0;
  int pidfd = -1;  // the task's weft-init (borrowed), for its network namespace
  bool own_network = false;
  std::string path, metric;
};

class ScrapeBatch {
 public:
  using Done = std::function<void(std::map<std::string, Result<double>>)>;
  // Starts every scrape; `done` runs once, from the loop, when the last has ended.
  static std::unique_ptr<ScrapeBatch> start(EventLoop& loop, HttpClient& http,
                                            std::vector<ScrapeTarget> targets, Done done);
  ~ScrapeBatch();
  ScrapeBatch(const ScrapeBatch&) = delete;
  ScrapeBatch& operator=(const ScrapeBatch&) = delete;

 private:
  ScrapeBatch(EventLoop& loop, HttpClient& http, Done done)
      : loop_(loop), http_(http), done_(std::move(done)) {}
  void ended(const std::string& task, Result<double> r);
  EventLoop& loop_;
  HttpClient& http_;
  Done done_;
  std::map<std::string, Result<double>> results_;
  std::map<uint64_t, std::string> in_flight_;  // request id -> task
  size_t left_ = 0;
  Source defer_;
};

}  // namespace weft::agent
