// A client of etcd's v3 API through its native gRPC interface (KV Range and Txn, Lease
// grant, revoke and keepalive, Watch; controlplane/store/etcd/rpc.proto): plain HTTP/2 on
// loopback for tests ("http://host:port"), TLS with the member's CA and this client's
// certificate and key in production ("https://host:port"). docs/decisions.md says why
// gRPC replaced the JSON gateway.
//
// Calls are synchronous and bounded by `timeout_ms` each: the control plane makes them
// when it starts, from its committer thread, and from its lease-keeping thread. A call
// that cannot reach a member tries the next endpoint once around the list; an answer
// from etcd (an error included) ends the call. gRPC keeps one HTTP/2 connection per
// member and reconnects by itself.
//
// One client is used by one thread at a time, but cancel_waits() (any thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace weft::etcd {

struct Config {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", "https://etcd1:2379"
  std::string ca, cert, key;           // TLS files (cert and key: client authentication)
  uint64_t timeout_ms = 2000;
};

struct Kv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

struct Op {
  enum class Kind { kPut, kDelete, kDeleteRange } kind = Kind::kPut;
  std::string key, value;
  std::string range_end;  // kDeleteRange: [key, range_end)
  int64_t lease = 0;      // kPut: the key goes with this lease
};

// Equality only: "the key's create revision is N" (0: the key does not exist) or "its
// value is V".
struct Compare {
  enum class Target { kCreate, kValue } target = Target::kCreate;
  std::string key;
  int64_t create_revision = 0;
  std::string value;
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;  // the store's revision after the transaction
};

// The end of the range of every key starting with `prefix` (etcd's "prefix end").
std::string prefix_end(const std::string& prefix);

// The keys of a RangeResponse as the network delivered it (protobuf bytes; hostile
// input).
Result<std::vector<Kv>> parse_range(const std::string& wire);

class Client {
 public:
  static Result<std::unique_ptr<Client>> create(Config cfg);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Every key with this prefix, in key order (read in pages).
  // Every key under `prefix`, in pages read at one revision (`revision`: that revision,
  // from which a watch of what changed since starts).
  Result<std::vector<Kv>> range_prefix(const std::string& prefix, int64_t* revision = nullptr);
  // The last `limit` keys with this prefix, newest key first.
  Result<std::vector<Kv>> last(const std::string& prefix, size_t limit);
  Result<std::optional<Kv>> get(const std::string& key);
  Result<TxnResult> txn(const std::vector<Compare>& compares, const std::vector<Op>& success);
  Result<int64_t> lease_grant(int64_t ttl_s);
  // The lease's remaining TTL in seconds; 0 when it has expired (or never existed).
  Result<int64_t> lease_keepalive(int64_t id);
  Status lease_revoke(int64_t id);
  // Reachable and serving (a linearizable read of one key).
  Status ping();
  // Watches `key` from `after_revision` + 1 (a Watch stream): true when it was deleted
  // (or had been since), false when `timeout_ms` passed first or cancel_waits() was
  // called. Followers wait on the leader's key with this instead of polling it.
  Result<bool> wait_deleted(const std::string& key, int64_t after_revision, uint64_t timeout_ms);
  // Watches every key under `prefix` from `after_revision` + 1: true when one was put or
  // deleted (or the history was compacted past it: read again), false when `timeout_ms`
  // passed first or cancel_waits() was called. A reader of a prefix waits with this
  // instead of polling it.
  Result<bool> wait_changed(const std::string& prefix, int64_t after_revision, uint64_t timeout_ms);
  // Ends a wait_deleted() or wait_changed() in progress (from any thread); later waits
  // are not affected.
  void cancel_waits();

  const Config& config() const { return cfg_; }
  struct Impl;

 private:
  explicit Client(Config cfg);
  Result<std::vector<Kv>> range(const std::string& key, const std::string& end, size_t limit,
                                bool descend, int64_t at_revision = 0,
                                int64_t* header_revision = nullptr);
  // The watch behind wait_deleted and wait_changed: true at the first event `fired` says
  // counts (or a compaction or cancellation by etcd).
  Result<bool> watch_until(const std::string& key, const std::string& range_end,
                           int64_t after_revision, uint64_t timeout_ms, bool deletes_only);
  Config cfg_;
  size_t current_ = 0;  // the endpoint that answered last
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::etcd
