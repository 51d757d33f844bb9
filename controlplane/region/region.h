// A region of several control-plane roles (docs/regions.md): the records they share in
// etcd under the region's prefix, and the thread that reads and writes them for an event
// loop.
//
//   <prefix>entitlements/<name>  {"shard": "s1"}              which shard owns it
//   <prefix>machines/<name>      {"holder": "s1", "epoch": 4}  which shard holds it
//   <prefix>moves/<name>         {"from": "s1", "to": "s2", "step": "export", ...}
//                                an entitlement moving between shards (at most one)
//
// Both are hostile input when read back (a corrupt or forged etcd): parsed strictly,
// refused with the key named. An entitlement's home is created only if absent, so two
// front ends cannot give one entitlement to two shards. A machine is lent and returned
// by transactions that compare the whole record read before, so two shards can never
// hold one machine, and every change of holder raises the epoch: a command that carries
// an older epoch is stale.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/event.h"
#include "common/fs.h"
#include "common/result.h"
#include "controlplane/store/etcd_client.h"

namespace weft::cp {

// What this weft-controlplane process is in its region ([region] role).
enum class RegionRole { kAllInOne, kShard, kFrontEnd, kBroker };
const char* region_role_name(RegionRole r);

struct RegionConfig {
  RegionRole role = RegionRole::kAllInOne;
  std::string shard;                          // a shard's id ("s1")
  std::string prefix = "/weft-region/";       // the region's records in etcd
  std::map<std::string, std::string> shards;  // the region's shards: id -> endpoints
  // The region's broker groups (a shard's and a front end's): group -> its replicas
  // ("a:7070,b:7070"). `brokers = "..."` is one group, "default"; [region.brokers] names
  // several, each after the datacenter whose machines it keeps.
  std::map<std::string, std::string> brokers;
  std::string group = "default";  // a broker's own group
  // A shard gives a free machine back to the brokers once it has not needed it this long.
  uint64_t return_idle_us = 60'000'000;
};

// A shard's id: 1-32 of [a-z0-9-], starting with a letter or digit.
Status check_shard_id(const std::string& field, const std::string& id);

// <prefix>entitlements/<name>
std::string entitlement_home_key(const std::string& prefix, const std::string& name);
std::string entitlement_home_value(const std::string& shard);
// The shard a stored value names; `key` is named in the error.
Result<std::string> parse_entitlement_home(const std::string& key, const std::string& value);
// Every entitlement's home from a range of `<prefix>entitlements/`.
Result<std::map<std::string, std::string>> parse_entitlement_homes(
    const std::string& prefix, const std::vector<etcd::Kv>& kvs);

struct MachineHolder {
  std::string holder;  // "" = in the free pool
  uint64_t epoch = 0;  // raised by every lend and return
  std::string broker;  // the broker group that lent it ("" = in the free pool, or "default")
};
std::string machine_holder_key(const std::string& prefix, const std::string& machine);
std::string machine_holder_value(const MachineHolder& h);
Result<MachineHolder> parse_machine_holder(const std::string& key, const std::string& value);

// An entitlement's move between shards (docs/regions.md, "Moving an entitlement"), as
// the front end that drives it records it. Its steps, in order:
//   export   the old shard fences the entitlement and writes it out; the new one reads
//            it in, fenced (nothing acts for it on either shard)
//   release  the home is the new shard's (the one transaction that decides the move):
//            the new shard takes over the machines' holder records and opens the
//            entitlement, then the old shard forgets it
//   rollback the move did not get to `release`: the new shard drops what it read in,
//            the old one opens the entitlement again
// The record goes when its last step is done on both shards. `driver` names the front
// end driving it and `beat_us` when it last did (wall clock): another front end takes
// it over once the beat is kMoveStaleUs old.
struct MoveRecord {
  std::string from, to, step = "export";
  std::string driver;
  uint64_t started_us = 0, beat_us = 0;
  std::string why;  // a rollback's reason
};
inline constexpr uint64_t kMoveStaleUs = 10'000'000;
std::string move_key(const std::string& prefix, const std::string& name);
std::string move_value(const MoveRecord& m);
Result<MoveRecord> parse_move(const std::string& key, const std::string& value);
// Every move under way, by entitlement, with the record's value as read (for compare).
struct MoveRead {
  MoveRecord record;
  std::string value;
};
Result<std::map<std::string, MoveRead>> read_moves(etcd::Client& c, const std::string& prefix);
// Starts a move of `name` from `m.from`: refused unless its home is m.from and no move of
// it is under way.
Status begin_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                  const MoveRecord& m);
// Replaces the record read as `read` with `next` (kConflict: it changed meanwhile). With
// `next.step` "release" (from "export") the entitlement's home becomes `next.to` in the
// same transaction, compared with `next.from` first.
Status advance_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                    const std::string& read, const MoveRecord& next);
// Deletes the record if it is still `read`.
Status end_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                const std::string& read);

// The transactions (synchronous: from an EtcdWorker's thread or a tool). The home of
// `name` becomes `shard` unless it has one (kConflict naming the shard that has it: the
// entitlement exists).
Status claim_entitlement_home(etcd::Client& c, const std::string& prefix, const std::string& name,
                              const std::string& shard);
// Removes the home of `name` if it is still `shard`'s.
Status drop_entitlement_home(etcd::Client& c, const std::string& prefix, const std::string& name,
                             const std::string& shard);
// Lends `machine` to `shard`: it must be free (or unknown to the region); kConflict names
// the shard that holds it. The new record (its epoch) is returned.
Result<MachineHolder> lend_machine(etcd::Client& c, const std::string& prefix,
                                   const std::string& machine, const std::string& shard,
                                   const std::string& broker = "default");
// Hands `machine` from shard `from` (holding it at `epoch`) straight to shard `to`, not
// through the free pool (an entitlement moving between shards with its machines): the
// epoch is raised, the lending group kept. Refused (kConflict) unless `from` holds it at
// `epoch` now; compares the whole record read, as a lend does.
Result<MachineHolder> transfer_machine(etcd::Client& c, const std::string& prefix,
                                       const std::string& machine, const std::string& from,
                                       uint64_t epoch, const std::string& to);
// The next number of a region-wide sequence at `key` (a transaction on its last value:
// two callers never get the same one): 1, 2, ...
Result<uint64_t> next_in_sequence(etcd::Client& c, const std::string& key);
// Returns `machine` to the free pool, if `shard` holds it at `epoch`.
Result<MachineHolder> return_machine(etcd::Client& c, const std::string& prefix,
                                     const std::string& machine, const std::string& shard,
                                     uint64_t epoch);

// One thread that makes etcd calls for an event loop: post() queues work that runs on
// the thread with its own client; what the work returns runs on the loop afterwards, in
// order. Nothing on the loop waits for etcd. Destroying the worker drops work not begun
// and waits for the call under way (bounded by the client's timeout).
class EtcdWorker {
 public:
  using Then = std::function<void()>;
  using Work = std::function<Then(etcd::Client&)>;
  static Result<std::unique_ptr<EtcdWorker>> create(EventLoop& loop, etcd::Config cfg);
  ~EtcdWorker();
  EtcdWorker(const EtcdWorker&) = delete;
  EtcdWorker& operator=(const EtcdWorker&) = delete;
  void post(Work w);
  size_t queued() const;
  // Ends the client's watch in progress, if any (from the loop).
  void cancel_waits() { client_->cancel_waits(); }

 private:
  EtcdWorker() = default;
  void run();
  void deliver();
  std::unique_ptr<etcd::Client> client_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> work_;
  std::deque<Then> done_;
  bool stop_ = false;
  Fd efd_;
  Source wake_;
  std::thread thread_;
};

// A watch of everything under an etcd prefix, for a reader on an event loop: told the
// revision its last read saw (after()), it waits on a thread of its own (a Watch
// stream, up to 5 s at a time, then again) and calls `changed` on the loop once anything
// under the prefix changed since; the reader reads again and says after() again. One
// wait at a time; a failed one is tried again a second later.
class PrefixWatch {
 public:
  static Result<std::unique_ptr<PrefixWatch>> create(EventLoop& loop, etcd::Config cfg,
                                                     std::string prefix,
                                                     std::function<void()> changed);
  void after(int64_t revision);

 private:
  PrefixWatch(EventLoop& loop, std::string prefix, std::function<void()> changed)
      : loop_(loop), prefix_(std::move(prefix)), changed_(std::move(changed)) {}
  void wait();
  EventLoop& loop_;
  std::string prefix_;
  std::function<void()> changed_;
  std::unique_ptr<EtcdWorker> worker_;
  int64_t revision_ = 0;
  bool waiting_ = false;
  Source retry_;
};

}  // namespace weft::cp
