#include "agent/metric_scrape.h"

#include "agent/readiness.h"
#include "common/prometheus_text.h"

namespace weft::agent {

std::unique_ptr<ScrapeBatch> ScrapeBatch::start(EventLoop& loop, HttpClient& http,
                                                std::vector<ScrapeTarget> targets, Done done) {
  std::unique_ptr<ScrapeBatch> b(new ScrapeBatch(loop, http, std::move(done)));
  b->left_ = targets.size() + 1;  // and this loop's own, so that no answer ends it early
  ScrapeBatch* self = b.get();
  for (auto& t : targets) {
    if (t.port == 0) {
      self->ended(t.task, make_error("the task has no such port"));
      continue;
    }
    HttpRequest req;
    req.url = "http://127.0.0.1:" + std::to_string(t.port) + t.path;
    req.timeout_us = kScrapeTimeoutUs;
    req.max_body = kMaxMetricsBody + 1;  // one byte more: a longer body is refused
    if (t.own_network) {
      int pidfd = t.pidfd;
      req.open_socket = [pidfd](int family, int type, int protocol) {
        return socket_in_netns(pidfd, family, type, protocol);
      };
    }
    std::string task = t.task, metric = t.metric;
    // The request's id is known only once get() returns: an answer that comes first
    // (a refusal made at once) is matched by task, not id.
    auto id = http.get(std::move(req), [self, task, metric](Result<HttpResponse> r) {
      for (auto it = self->in_flight_.begin(); it != self->in_flight_.end(); ++it)
        if (it->second == task) {
          self->in_flight_.erase(it);
          break;
        }
      if (!r.ok()) return self->ended(task, r.error());
      if (r->status < 200 || r->status >= 300)
        return self->ended(task, make_error("HTTP " + std::to_string(r->status)));
      self->ended(task, prometheus_sum(r->body, metric));
    });
    if (id.ok()) {
      if (!self->results_.count(task)) self->in_flight_[*id] = task;
    } else {
      self->ended(task, id.error());
    }
  }
  // The loop's own count, from the loop: `done` never runs inside start().
  auto d = loop.add_defer([self] {
    self->defer_.reset();
    self->ended("", Result<double>(0.0));
  });
  if (d.ok())
    self->defer_ = std::move(d).value();
  else
    self->ended("", Result<double>(0.0));
  return b;
}

ScrapeBatch::~ScrapeBatch() {
  for (const auto& [id, task] : in_flight_) http_.cancel(id);
}

void ScrapeBatch::ended(const std::string& task, Result<double> r) {
  if (!task.empty()) results_.insert_or_assign(task, std::move(r));
  if (--left_ == 0 && done_) {
    Done done = std::move(done_);
    done_ = nullptr;
    done(std::move(results_));  // may destroy this batch: nothing after
  }
}

}  // namespace weft::agent
