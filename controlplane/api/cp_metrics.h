// The control plane's Prometheus metrics (docs/metrics.md): the registry served on
// `metrics_listen`, and the histograms and counters the request path and the tick feed.
// What the rest of the control plane's state says is sampled by the collectors the
// Manager adds (one per part: the Manager's, Discovery's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/metrics.h"

namespace weft::cp {

class CpMetrics {
 public:
  void request(const std::string& method, double seconds, bool ok) {
    request_seconds_.observe(method, seconds);
    if (!ok) ++request_errors_[method];
  }
  void tick(double seconds) { tick_seconds_.observe(seconds); }
  void add(metrics::Collector c) { registry_.add(std::move(c)); }
  // Serves /metrics on `listen` ("" = none; one that cannot listen is logged and left).
  void serve(EventLoop& loop, const std::string& listen) {
    http_ = metrics::HttpServer::serve(loop, listen, &registry_);
  }
  std::string address() const { return http_ ? http_->address() : "-"; }
  // The request and tick families.
  void write_requests(metrics::Writer& w) const {
    w.family("weft_cp_request_seconds", "histogram",
             "Time to handle a request, by method (before its group commit).");
    request_seconds_.write(w, "weft_cp_request_seconds");
    w.family("weft_cp_request_errors_total", "counter", "Requests answered with an error.");
    for (const auto& [method, n] : request_errors_)
      w.sample("weft_cp_request_errors_total", static_cast<double>(n), {{"method", method}});
  }
  void write_ticks(metrics::Writer& w) const {
    w.family("weft_cp_tick_seconds", "histogram", "The periodic tick (failures, budgets, prune).");
    tick_seconds_.write(w, "weft_cp_tick_seconds");
  }

 private:
  metrics::Registry registry_;
  std::unique_ptr<metrics::HttpServer> http_;
  metrics::HistogramVec request_seconds_{"method"};
  std::map<std::string, uint64_t> request_errors_;
  metrics::Histogram tick_seconds_;
};

}  // namespace weft::cp
