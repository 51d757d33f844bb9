#include "controlplane/store/leader.h"

#include <algorithm>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"

namespace weft::cp {

namespace {
constexpr uint64_t kCampaignEveryUs = 200'000;
}

Result<std::unique_ptr<Leadership>> Leadership::start(LeaderConfig cfg) {
  if (cfg.ttl_s < 2 || cfg.ttl_s > 60) return field_error("lease_ttl", "must be 2s to 60s");
  if (cfg.key.empty()) return make_error("no election key");
  // A call may take at most a third of the TTL: a leader whose etcd stopped answering
  // notices before its lease can expire.
  cfg.etcd.timeout_ms = std::min<uint64_t>(cfg.etcd.timeout_ms, cfg.ttl_s * 1000 / 3);
  TRY(etcd::Client::create(cfg.etcd));  // the configuration is checked now
  std::unique_ptr<Leadership> l(new Leadership(std::move(cfg)));
  l->thread_ = std::thread([p = l.get()] { p->run(); });
  return l;
}

Leadership::~Leadership() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    if (client_) client_->cancel_waits();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string Leadership::leader() const {
  std::lock_guard<std::mutex> g(mu_);
  return leader_;
}

std::string Leadership::lost_reason() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!lost_reason_.empty() || !lost()) return lost_reason_;
  return no_keepalive_for(now_us() - valid_until_us_.load() + ttl_us() - margin_us());
}

std::string Leadership::no_keepalive_for(uint64_t us) {
  return "no keepalive of the leadership lease succeeded for " + std::to_string(us / 1000) + " ms";
}

uint64_t Leadership::ttl_us() const {
  return static_cast<uint64_t>(cfg_.ttl_s) * 1'000'000;
}

uint64_t Leadership::now_us() {
  return now_monotonic_us();
}

uint64_t Leadership::margin_us() const {
  return std::max<uint64_t>(ttl_us() / 6, 300'000);
}

void Leadership::sleep_us(uint64_t us) {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait_for(g, std::chrono::microseconds(us), [this] { return stop_.load(); });
}

void Leadership::lose(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu_);
    lost_reason_ = why;
  }
  lost_ = true;
}

void Leadership::run() {
  auto client = etcd::Client::create(cfg_.etcd);
  if (!client.ok()) return lose(client.error().str());
  etcd::Client& c = **client;
  {
    std::lock_guard<std::mutex> g(mu_);
    client_ = &c;
  }
  while (!stop_.load() && !lost_.load()) {
    if (leading_.load())
      keep(c);
    else
      campaign(c);
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    client_ = nullptr;
  }
  if (leading_.load() && lease_ != 0) {
    // Handing over: the key goes with the lease, a follower wins at its next attempt.
    if (auto s = c.lease_revoke(lease_); !s.ok())
      log_warn("could not give up the leadership lease; followers wait for its TTL",
               {{"ERROR", s.error().str()}});
  }
}

void Leadership::campaign(etcd::Client& c) {
  auto current = c.get(cfg_.key);
  if (!current.ok()) {
    log_debug("election: etcd unreachable", {{"ERROR", current.error().str()}});
    return sleep_us(kCampaignEveryUs);
  }
  if (*current) {
    {
      std::lock_guard<std::mutex> g(mu_);
      leader_ = (*current)->value;
    }
    // Another replica leads: wait on its key (a watch) and campaign the moment it goes,
    // rather than polling. A second at most, so that the leader's name stays fresh and a
    // stop is never held up long.
    auto gone = c.wait_deleted(cfg_.key, (*current)->mod_revision, 1000);
    if (!gone.ok()) {
      log_debug("election: watch failed", {{"ERROR", gone.error().str()}});
      sleep_us(kCampaignEveryUs);
    }
    return;
  } else {
    auto lease = c.lease_grant(cfg_.ttl_s);
    if (lease.ok()) {
      uint64_t t0 = now_monotonic_us();
      auto won = c.txn({{etcd::Compare::Target::kCreate, cfg_.key, 0, {}}},
                       {{etcd::Op::Kind::kPut, cfg_.key, cfg_.identity, {}, *lease}});
      if (won.ok() && won->succeeded) {
        lease_ = *lease;
        last_kept_us_ = t0;
        valid_until_us_ = t0 + ttl_us() - margin_us();
        revision_ = won->revision;
        {
          std::lock_guard<std::mutex> g(mu_);
          leader_ = cfg_.identity;
        }
        leading_ = true;
        log_info("this control plane leads", {{"REVISION", std::to_string(won->revision)},
                                              {"LEASE_TTL", std::to_string(cfg_.ttl_s)}});
        return;
      }
      (void)c.lease_revoke(*lease);  // another replica was faster
    }
  }
  sleep_us(kCampaignEveryUs);
}

void Leadership::keep(etcd::Client& c) {
  uint64_t t0 = now_monotonic_us();
  // Past the deadline already (lost() says so): a keepalive that succeeds now does not
  // undo it (the daemon may have seen it and stepped down).
  if (t0 >= valid_until_us_.load()) return lose(no_keepalive_for(t0 - last_kept_us_));
  auto left = c.lease_keepalive(lease_);
  // etcd counts the TTL from when it received the keepalive, which is after t0: acting
  // on until t0 + ttl - margin stays inside the lease whatever the clocks' rates.
  if (left.ok() && *left > 0) {
    last_kept_us_ = t0;
    valid_until_us_ = t0 + ttl_us() - margin_us();
  }
  if (left.ok() && *left == 0) return lose("the leadership lease expired");
  if (uint64_t now = now_monotonic_us(); now >= valid_until_us_.load())
    return lose(no_keepalive_for(now - last_kept_us_) +
                (left.ok() ? std::string() : ": " + left.error().str()));
  // Every sixth of the TTL: several tries fit before the margin, and the lease a killed
  // leader leaves expires within TTL/6 of the TTL after the kill (docs/replicas.md).
  sleep_us(left.ok() ? ttl_us() / 6 : 100'000);
}

}  // namespace weft::cp
