// A shard checks what another role asks of it against the region's records in etcd
// (docs/regions.md, "A rule for every role"; issue 59): a front end's word is not enough,
// whatever certificate it holds. A front end that replays a step, has a bug or is
// compromised is refused with the reason, and nothing is done.
//
//   region.move step   must be the step the move's record (moves/<name>) is at, between
//                      the shards it names (check_move_step below)
//   entitlement.create must find the entitlement's home (entitlements/<name>) claimed
//                      for this shard already
//
// The records are read on the etcd thread (EtcdWorker); the answer runs on the loop.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/event.h"
#include "common/result.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/records.h"
#include "controlplane/store/etcd_client.h"

namespace weft::cp {

// Pure: whether shard `me` may do `step` of entitlement `name`'s move, `other` being the
// shard the step names ("to" for out and forget, "from" for in; "" for the others), given
// the move's record (nullopt: none) and the entitlement's home (nullopt: none). Errors
// (kConflict) say what the records say instead.
Status check_move_step(const std::string& name, const std::string& step, const std::string& me,
                       const std::string& other, const std::optional<MoveRecord>& move,
                       const std::optional<std::string>& home);

class RegionChecks {
 public:
  static Result<std::unique_ptr<RegionChecks>> create(EventLoop& loop, etcd::Config cfg,
                                                      std::string prefix, std::string me);
  // check_move_step with the records as etcd has them now.
  void move_step(const std::string& name, const std::string& step, const std::string& other,
                 std::function<void(Status)> done);
  // Whether entitlement `name`'s home is this shard.
  void home_is_mine(const std::string& name, std::function<void(Status)> done);
  ~RegionChecks() { *alive_ = false; }
  RegionChecks(const RegionChecks&) = delete;
  RegionChecks& operator=(const RegionChecks&) = delete;

 private:
  RegionChecks(std::unique_ptr<EtcdWorker> etcd, std::string prefix, std::string me)
      : etcd_(std::move(etcd)), prefix_(std::move(prefix)), me_(std::move(me)) {}
  std::unique_ptr<EtcdWorker> etcd_;
  std::string prefix_, me_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace weft::cp
