// Machines lent between a region's brokers and shards (docs/regions.md).
//
// The broker is the one arbiter of which shard holds a machine: it keeps the free pool
// (the machines whose daemons talk to it), lends free machines to a shard that asks
// (pool.lend), and takes them back (pool.return). Each lend and return is an etcd
// transaction on the machine's holder record (region.h), so two shards can never hold
// one machine, and every change of holder raises its epoch.
//
// A shard with brokers configured serves only the machines it holds: it asks its brokers
// for machines when its entitlements' quotas need more than it has free, and gives back
// free machines it has not needed for `return_idle`. A region may have several broker
// groups, each named after the datacenter whose machines it keeps: an entitlement of
// datacenter X borrows from group X; one without a datacenter (or of a datacenter no
// group is named after) from each group in turn. A machine goes back to the group that
// lent it (its holder record names the group).
//
// A machine's daemons follow: the control plane that does not hold a machine answers its
// daemons with kMoved naming the one that does (the broker names the shard; a shard
// names the brokers with ""), and the machine's daemons go there (common/cp_link.h).
// Nothing on the machine stops meanwhile.
//
// The Manager owns one Lending (broker or shard roles only) and tells it little: the
// machines it could lend or does not need (Hooks), and each machine daemon's hello.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cp_link.h"
#include "common/event.h"
#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/prefix_watch.h"
#include "controlplane/region/records.h"
#include "controlplane/region/region.h"

namespace weft::cp {

class Lending {
 public:
  struct Hooks {
    // Broker: up to `count` machines it may lend now (free, healthy, empty, in service),
    // none in the fault domains `avoid`.
    std::function<std::vector<std::string>(size_t count, const std::set<std::string>& avoid)>
        lendable;
    // Shard: how many more machines its entitlements' quotas need than it has free, by
    // datacenter ("" = any; a negative sum: that many to spare), and which free, empty
    // machines it could give back.
    std::function<std::map<std::string, long>()> shortfall;
    std::function<std::vector<std::string>()> spare;
    // Shard (optional): datacenters whose entitlements' spread its ReBalancer could not
    // restore with the machines it holds, and the fault domains crowded there: a machine
    // of another domain is borrowed for it (Rebalancer::wanted).
    std::function<std::map<std::string, std::set<std::string>>()> wanted;
    // Shard: whether a machine it borrowed has arrived (registered here, in service).
    std::function<bool(const std::string& machine)> present;
    // Either: the machine is no longer this control plane's (lent, or given back): close
    // its daemons' sessions and forget it.
    std::function<void(const std::string& machine)> release;
  };
  static Result<std::unique_ptr<Lending>> create(EventLoop& loop, const CpConfig& cfg, Hooks hooks);
  ~Lending();

  // Reads the region's machine holders (at the start of a leader's term: synchronous).
  Status load();
  // A machine daemon's call: OK when this control plane serves `machine`, else kMoved
  // naming where it belongs.
  Status admit(const std::string& machine) const;
  // Broker: pool.lend and pool.return (the reply once etcd has the change).
  void lend(const std::string& shard, size_t count, const std::set<std::string>& avoid,
            rpc::ReplyFn reply);
  void give_back(const std::string& shard, const std::string& machine, uint64_t epoch,
                 rpc::ReplyFn reply);
  // Shard: asks for or gives back machines as the quotas need (every tick).
  void round(uint64_t now_us);
  nlohmann::json status() const;
  bool held_here(const std::string& machine) const;
  // Shard: {"shard", "epoch"} of a machine it holds, which its registration's reply and
  // every command to it carry (the agent refuses an older holder: agent/cp_session.h
  // HolderFence); null when this shard does not hold it by a lend.
  nlohmann::json holder_of(const std::string& machine) const;
  // An entitlement moving between shards (entitlement_moves.h). The new shard takes over
  // its machines from shard `from` (each holder record handed over in a transaction at
  // the epoch it has, raised by one; a machine this shard holds already is kept): `done`
  // gets the machines now held here, and why the others are not (`retry`: etcd did not
  // answer, try again; else they are held elsewhere and will not come).
  using TakenOver = std::function<void(std::vector<std::string> held, std::string why, bool retry)>;
  void take_over(const std::vector<std::string>& machines, const std::string& from, TakenOver done);
  // The old shard: the machine is another shard's now (its holder record says so).
  void handed_over(const std::string& machine) {
    holders_.erase(machine);
    arriving_.erase(machine);
    spare_since_.erase(machine);
  }
  // A broker: follows the holder records in etcd by a watch (a machine handed from
  // shard to shard by a move changes holder without this broker), so that it sends a
  // machine's daemons to the shard that holds it now.
  Status watch();

 private:
  Lending(EventLoop& loop, const CpConfig& cfg, Hooks hooks);
  bool broker() const { return region_.role == RegionRole::kBroker; }
  struct Group {
    std::unique_ptr<ControlPlaneLink> link;
    bool asking = false;  // a pool.lend in flight
  };
  // The group a shard asks for machines of datacenter `dc` ("": none connected).
  std::string group_for(const std::string& dc);
  // `wanted_dc`: the datacenter whose ReBalancer's want this ask serves, if any.
  void ask(const std::string& group, size_t count, const std::set<std::string>& avoid = {},
           const std::string* wanted_dc = nullptr);
  void give(const std::string& machine, uint64_t now_us);

  EventLoop& loop_;
  RegionConfig region_;
  etcd::Config etcd_cfg_;
  Hooks hooks_;
  std::unique_ptr<EtcdWorker> etcd_;
  std::unique_ptr<PrefixWatch> watch_;  // watch(): a broker's view of the holders
  void reread();
  bool rereading_ = false;
  std::map<std::string, MachineHolder>
      holders_;                          // the broker: every lent machine; a shard: its own
  std::map<std::string, Group> groups_;  // a shard's links to its broker groups
  size_t turn_ = 0;                      // the next group asked for any datacenter
  rpc::Dispatcher no_commands_;
  std::set<std::string> giving_;                 // returns in flight
  std::map<std::string, uint64_t> spare_since_;  // a shard's free machines: since when
  // When a shard may next borrow for its ReBalancer's spread, by datacenter: a machine
  // lent for it, kWantedEveryUs later (one it then cannot use is not borrowed again at
  // once); none, kWantedRetryUs later.
  std::map<std::string, uint64_t> wanted_next_;
  static constexpr uint64_t kWantedEveryUs = 300'000'000, kWantedRetryUs = 15'000'000;
  // Borrowed machines whose daemons have not registered yet, when and from which group
  // they were lent: counted as coming for kArrivalUs, so that a round does not borrow
  // them twice.
  std::map<std::string, std::pair<uint64_t, std::string>> arriving_;
  // (A region lending tens of thousands of machines at once keeps some on their way for
  // tens of seconds: 30 s made a shard borrow a quarter more than its quota.)
  static constexpr uint64_t kArrivalUs = 120'000'000;
  uint64_t lent_ = 0, returned_ = 0, refused_ = 0;
};

}  // namespace weft::cp
