// Leader election among control plane replicas on etcd (docs/replicas.md).
//
// Each replica runs one Leadership. Its thread (not the event loop: etcd calls are
// synchronous, bounded by their timeout) watches the election key while another replica
// holds it, and campaigns the moment it is deleted (or absent):
// it takes a lease of `ttl_s` seconds and creates the key with it in one transaction
// ("create revision is 0", so only one replica can succeed). The winner keeps the lease
// alive every ttl/6; the key's create revision is its fence (EtcdStore::fence). When a
// keepalive says the lease is gone, or none succeeded for ttl minus a margin (etcd may
// expire it any moment), the leadership is lost for good: the daemon must stop. A
// replica that stops cleanly revokes its lease, so a follower takes over at once instead
// of after the TTL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/result.h"
#include "controlplane/store/etcd_client.h"

namespace weft::cp {

struct LeaderConfig {
  etcd::Config etcd;
  std::string key;       // "<prefix>leader"
  std::string identity;  // what followers tell clients: this replica's "host:port"
  int64_t ttl_s = 2;
};

class Leadership {
 public:
  static Result<std::unique_ptr<Leadership>> start(LeaderConfig cfg);
  ~Leadership();  // stops campaigning; revokes the lease if this replica leads
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  bool leading() const { return leading_.load() && !lost(); }
  // Lost for good: the thread said so, or it is past the moment it must have renewed the
  // lease by (TTL minus the margin after the last keepalive that succeeded), even while
  // its thread still waits on etcd: a keepalive blocked up to its timeout must not keep
  // a leader acting past the earliest moment etcd may expire its lease.
  bool lost() const {
    return lost_.load() || (leading_.load() && now_us() >= valid_until_us_.load());
  }
  // The election key's create revision when this replica won (the fence).
  int64_t revision() const { return revision_.load(); }
  // The leader's identity as last read ("" when none or unknown).
  std::string leader() const;
  // Why leadership was lost, once lost().
  std::string lost_reason() const;

 private:
  explicit Leadership(LeaderConfig cfg) : cfg_(std::move(cfg)) {}
  void run();
  void campaign(etcd::Client& c);
  void keep(etcd::Client& c);
  void lose(const std::string& why);
  void sleep_us(uint64_t us);

  LeaderConfig cfg_;
  std::atomic<bool> leading_{false}, lost_{false}, stop_{false};
  std::atomic<int64_t> revision_{0};
  static uint64_t now_us();
  static std::string no_keepalive_for(uint64_t us);
  uint64_t ttl_us() const;
  uint64_t margin_us() const;
  int64_t lease_ = 0;
  uint64_t last_kept_us_ = 0;                // when the last successful keepalive was sent
  std::atomic<uint64_t> valid_until_us_{0};  // last_kept_us_ + TTL - margin
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string leader_, lost_reason_;
  etcd::Client* client_ = nullptr;  // the thread's, while it runs (cancel_waits on stop)
  std::thread thread_;
};

}  // namespace weft::cp
