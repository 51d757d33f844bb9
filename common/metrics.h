// Metrics of a weft daemon in the Prometheus text exposition format (version 0.0.4),
// served over HTTP on `/metrics` by libmicrohttpd driven from the daemon's own sd-event
// loop (no thread, nothing blocks). Each daemon registers collectors that write its
// samples from its own state when scraped; counters and histograms it keeps itself.
// docs/metrics.md lists the metric names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/event.h"
#include "common/result.h"

namespace weft::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Builds one exposition: a family's HELP and TYPE, then its samples.
class Writer {
 public:
  void family(const std::string& name, const char* type, const std::string& help);
  void sample(const std::string& name, double value, const Labels& labels = {});
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A histogram of seconds (or any unit) with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds = default_bounds());
  void observe(double value);
  // The _bucket, _sum and _count samples of `name` (its family written by the caller).
  void write(Writer& w, const std::string& name, const Labels& labels = {}) const;
  uint64_t count() const { return count_; }
  // 100 µs to 10 s.
  static std::vector<double> default_bounds();

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;  // not cumulative; summed when written
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Histograms by one label value (e.g. by method), created on first use.
class HistogramVec {
 public:
  explicit HistogramVec(std::string label) : label_(std::move(label)) {}
  void observe(const std::string& value, double v) { by_[value].observe(v); }
  void write(Writer& w, const std::string& name) const;

 private:
  std::string label_;
  std::map<std::string, Histogram> by_;
};

using Collector = std::function<void(Writer&)>;

class Registry {
 public:
  void add(Collector c) { collectors_.push_back(std::move(c)); }
  std::string render() const;

 private:
  std::vector<Collector> collectors_;
};

// "host:port" with a numeric IPv4 or [IPv6] address, or "unix:/path" (a socket made
// 0660: who may scrape is who may open it, and no local user can take the address
// before the daemon starts); "" means no endpoint.
Status check_listen(const std::string& listen);
// A daemon configuration's `metrics_listen` key (the one reader, for every daemon):
// `*out` keeps its default when the key is absent; errors name file and line.
Status read_listen(const TomlDoc& doc, const toml::table& t, std::string* out);

// The HTTP endpoint: GET /metrics (404 elsewhere, 405 for other methods), at most 32
// connections (8 from one address over TCP), each closed after 5 s idle.
class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> start(EventLoop& loop, const std::string& listen,
                                                   const Registry* registry);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  uint16_t port() const { return port_; }
  // For a daemon's start: the endpoint, or null (logged) when it cannot listen: a
  // daemon serves without metrics rather than not at all. "" = none.
  static std::unique_ptr<HttpServer> serve(EventLoop& loop, const std::string& listen,
                                           const Registry* registry);
  // "host:port" actually bound (the port resolved when it was 0).
  std::string address() const { return address_; }
  // More pages than /metrics (the control plane's web view): for a URL path, its content
  // type and body, or false (404). Called on the loop's thread.
  using Pages = std::function<bool(const std::string& url, std::string* type, std::string* body)>;
  void set_pages(Pages pages) { pages_ = std::move(pages); }
  // The host names a request's Host header may carry (its port aside; case does not
  // matter); empty = any. Anything else is answered 421 and nothing else: a page in a
  // browser that an attacker's DNS name rebinds to this address gets nothing.
  void set_allowed_hosts(std::vector<std::string> hosts);
  bool host_allowed(const char* host_header) const;
  const Registry* registry() const { return registry_; }
  bool page(const std::string& url, std::string* type, std::string* body) const {
    return pages_ && pages_(url, type, body);
  }

 private:
  HttpServer(EventLoop& loop, const Registry* registry) : loop_(loop), registry_(registry) {}
  void run();  // MHD's work, then its next timeout
  struct Daemon;
  EventLoop& loop_;
  const Registry* registry_;
  Pages pages_;
  std::vector<std::string> allowed_hosts_;  // lower case
  Daemon* daemon_ = nullptr;
  Source io_, timer_;
  uint16_t port_ = 0;
  std::string address_;
};

}  // namespace weft::metrics
