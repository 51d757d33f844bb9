// A front end's part in moving entitlements between a region's shards (docs/regions.md,
// "Moving an entitlement"): it drives each move through its steps (region.h MoveRecord),
// asking the shards (region.move, entitlement_moves.h) and recording each step in etcd
// before the next, so that any front end can finish what another began.
//
//   export    the old shard fences and writes the entitlement out, the new one reads it
//             in (both again if asked again); then one etcd transaction moves the home
//             and records `release`: the move is decided
//   release   the new shard takes the machines over and opens; the old one forgets
//   rollback  (a move that could not reach `release` within kDecideUs, or that a shard
//             refused) the new shard drops what it read, the old one opens again
//
// A step a shard could not answer (it is changing leader, unreachable) is asked again
// every second; after `release` it is asked until it is done, whatever happens. Each
// front end looks at the moves in etcd every second and takes over one whose driver has
// not written for kMoveStaleUs (it died). Only the driver writes a record, and every
// write compares the record it read, so two front ends never drive one move at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/result.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/records.h"
#include "controlplane/region/transactions.h"

namespace weft::cp {

class MoveDriver {
 public:
  using Done = std::function<void(Result<nlohmann::json>)>;
  struct Hooks {
    // region.move with `params` on shard `shard`'s leader.
    std::function<void(const std::string& shard, const nlohmann::json& params, Done done)> call;
    // An entitlement's home changed (the front end reads the homes again).
    std::function<void()> homes_changed;
  };
  static Result<std::unique_ptr<MoveDriver>> create(EventLoop& loop, const CpConfig& cfg,
                                                    Hooks hooks);
  // entitlement.move: `name` (at home on `from`) to shard `to`. `done` once the move is
  // done or rolled back (the answer says which, and how long the entitlement was fenced),
  // or at once with the record made when `wait` is false.
  void start(const std::string& name, const std::string& from, const std::string& to, bool wait,
             Done done);
  // The moves under way, from etcd: entitlement -> its record as JSON.
  void list(std::function<void(Result<std::map<std::string, nlohmann::json>>)> done);
  // How long the steps before `release` may take before the move rolls back (tests:
  // $WEFT_TEST_MOVE_DECIDE_MS).
  static constexpr uint64_t kDecideUs = 60'000'000;

 private:
  MoveDriver(EventLoop& loop, const CpConfig& cfg, Hooks hooks);
  struct Drive {
    MoveRead read;
    std::vector<Done> waiting;
    uint64_t fenced_at_us = 0;  // monotonic: when the old shard fenced it (this driver)
    uint64_t fenced_us = 0;     // how long it was fenced, once open
    nlohmann::json counts;      // what the old shard wrote out
  };
  void round();
  void step(const std::string& name);
  void export_step(const std::string& name, const MoveRecord& rec);
  void copy_pages(const std::string& name, const MoveRecord& rec,
                  std::shared_ptr<std::vector<std::string>> pages, size_t total);
  void send_pages(const std::string& name, const MoveRecord& rec,
                  std::shared_ptr<std::vector<std::string>> pages, size_t next);
  void release_step(const std::string& name, const MoveRecord& rec);
  void rollback_step(const std::string& name, const MoveRecord& rec);
  // A shard did not do a step: asked again a second later, or (not decided yet, and
  // refused or past kDecideUs) rolled back.
  void failed(const std::string& name, const Error& e, const char* what);
  void after(const std::string& name, uint64_t us);  // step() again later
  // Writes `next` over the record read (one transaction; `then` on the loop).
  void write(const std::string& name, MoveRecord next, std::function<void(Status)> then);
  void rollback(const std::string& name, const std::string& why);
  void finish(const std::string& name, Result<nlohmann::json> r);
  bool retryable(const Error& e) const;

  EventLoop& loop_;
  std::string prefix_, me_;
  uint64_t decide_us_ = kDecideUs;
  Hooks hooks_;
  std::unique_ptr<EtcdWorker> etcd_;
  std::map<std::string, Drive> drives_;
  std::map<std::string, Source> timers_;
  Source round_timer_;
  bool reading_ = false;
};

}  // namespace weft::cp
