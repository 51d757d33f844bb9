#include "controlplane/discovery/region_services.h"

#include <nlohmann/json.hpp>

#include "common/cp_link.h"
#include "common/log.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/prefix_watch.h"
#include "controlplane/region/region.h"

namespace weft::cp {

using json = nlohmann::json;

Result<std::unique_ptr<RegionServices>> RegionServices::create(EventLoop& loop, const CpConfig& cfg,
                                                               Hooks hooks) {
  std::unique_ptr<RegionServices> r(
      new RegionServices(cfg.region.prefix, cfg.region.shard, std::move(hooks)));
  TRY_ASSIGN(r->etcd_, EtcdWorker::create(loop, cfg.store.etcd.etcd));
  RegionServices* self = r.get();
  TRY_ASSIGN(r->watch_,
             PrefixWatch::create(loop, cfg.store.etcd.etcd, cfg.region.prefix + "services/",
                                 [self] { self->round(); }));
  return r;
}

void RegionServices::round() {
  if (busy_) return;  // one round at a time: a slow etcd is not asked twice
  busy_ = true;
  // What changed since the last round, as etcd operations.
  std::map<std::string, std::string> now;
  for (const auto& [job, s] : hooks_.local()) now[job] = to_json(s).dump();
  std::vector<etcd::Op> ops;
  for (const auto& [job, value] : now) {
    auto it = published_.find(job);
    if (it == published_.end() || it->second != value)
      ops.push_back({etcd::Op::Kind::kPut, key(job), value, {}, 0});
  }
  for (const auto& [job, value] : published_)
    if (!now.count(job)) ops.push_back({etcd::Op::Kind::kDelete, key(job), {}, {}, 0});
  std::string base = prefix_ + "services/", own = shard_;
  etcd_->post([this, ops = std::move(ops), now = std::move(now), base,
               own](etcd::Client& c) -> EtcdWorker::Then {
    Status wrote;
    for (size_t i = 0; i < ops.size() && wrote.ok(); i += 64) {
      std::vector<etcd::Op> part(ops.begin() + static_cast<long>(i),
                                 ops.begin() + static_cast<long>(std::min(ops.size(), i + 64)));
      auto t = c.txn({}, part);
      if (!t.ok()) wrote = std::move(t).error();
    }
    int64_t revision = 0;
    auto kvs = c.range_prefix(base, &revision);
    Services others;
    std::string bad;
    if (kvs.ok())
      for (const auto& kv : *kvs) {
        std::string rest = kv.key.substr(base.size());
        size_t slash = rest.find('/');
        if (slash == std::string::npos) {
          bad = kv.key;
          continue;
        }
        std::string shard = rest.substr(0, slash), job = rest.substr(slash + 1);
        if (shard == own) continue;
        if (!check_shard_id(kv.key, shard).ok() || !check_machine_name(kv.key, job, true).ok()) {
          bad = kv.key;
          continue;
        }
        json j = kv.value.size() <= (4u << 20) ? json::parse(kv.value, nullptr, false) : json();
        auto s = parse_service(j, kv.key);
        if (!s.ok()) {
          bad = kv.key;
          continue;
        }
        others[job] = std::move(s).value();
      }
    Status read = kvs.ok() ? Status{} : Status(std::move(kvs).error());
    return [this, wrote, read, now, others = std::move(others), bad, revision]() mutable {
      busy_ = false;
      if (wrote.ok()) published_ = now;
      if (!wrote.ok() || !read.ok() || !bad.empty()) {
        if (errors_++ % 30 == 0)
          log_warn("the region's services: not all written or read",
                   {{"WRITE", wrote.ok() ? "ok" : wrote.error().str()},
                    {"READ", read.ok() ? "ok" : read.error().str()},
                    {"SKIPPED", bad}});
      }
      if (!read.ok()) return;
      watch_->after(revision);
      foreign_ = others.size();
      hooks_.apply(std::move(others));
    };
  });
}

}  // namespace weft::cp
