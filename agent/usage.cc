#include "agent/usage.h"

#include "common/clock.h"
#include "common/rpc/protocol.h"

namespace weft::agent {

Status UsageSampler::start(EventLoop& loop) {
  sample(now_monotonic_us());
  auto t = loop.add_timer_in(interval_us_, [this, &loop] {
    timer_.reset();
    (void)start(loop);
  });
  if (!t.ok()) return t.error();
  timer_ = std::move(t).value();
  return {};
}

void UsageSampler::sample(uint64_t now_us) {
  std::map<std::string, Seen> next;
  for (const auto& id : ids_()) {
    auto c = read_(id);
    if (!c) continue;  // gone since
    Seen s{now_us, *c, std::nullopt};
    if (auto it = seen_.find(id); it != seen_.end() && now_us > it->second.at_us) {
      const Seen& prev = it->second;
      uint64_t dt = now_us - prev.at_us;
      // A counter that went back (a restarted cgroup of the same name) counts from 0.
      auto rate = [dt](uint64_t now, uint64_t then, uint64_t scale) {
        uint64_t d = now >= then ? now - then : now;
        return static_cast<uint64_t>(static_cast<long double>(d) * scale / dt);
      };
      s.usage = TaskUsage{rate(c->cpu_usec, prev.counters.cpu_usec, 1000), c->mem_bytes,
                          rate(c->io_read_bytes, prev.counters.io_read_bytes, 1'000'000),
                          rate(c->io_write_bytes, prev.counters.io_write_bytes, 1'000'000)};
    }
    next.emplace(id, s);
  }
  seen_ = std::move(next);
}

Status UsageSampler::scrape(EventLoop& loop, HttpClient& http, UsageReport base,
                            std::vector<ScrapeTarget> targets,
                            std::function<void(UsageReport)> reply) {
  if (batches_.size() >= kMaxBatches)
    return make_error("too many metric scrapes at once").with_code(rpc::kUnavailable);
  uint64_t n = ++next_batch_;
  auto batch = ScrapeBatch::start(loop, http, std::move(targets),
                                  [this, n, base = std::move(base), reply = std::move(reply)](
                                      std::map<std::string, Result<double>> results) mutable {
                                    for (auto& [task, r] : results) {
                                      if (r.ok()) {
                                        if (auto it = base.tasks.find(task); it != base.tasks.end())
                                          it->second.metric = *r;
                                      } else if (base.scrape_errors.size() < kMaxScrapeErrors) {
                                        base.scrape_errors[task] = r.error().message.substr(0, 256);
                                      }
                                    }
                                    reply(std::move(base));
                                    batches_.erase(n);  // (this batch: nothing of it is used after)
                                  });
  batches_[n] = std::move(batch);
  return {};
}

UsageReport UsageSampler::report(const std::vector<std::string>& ids) const {
  UsageReport r;
  r.interval_ms = interval_ms();
  auto put = [&](const std::string& id, const Seen& s) {
    if (s.usage) r.tasks[id] = *s.usage;
  };
  if (ids.empty()) {
    for (const auto& [id, s] : seen_) put(id, s);
  } else {
    for (const auto& id : ids)
      if (auto it = seen_.find(id); it != seen_.end()) put(id, it->second);
  }
  return r;
}

}  // namespace weft::agent
