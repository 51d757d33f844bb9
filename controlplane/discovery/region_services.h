// Service discovery across a region's shards (docs/regions.md). Each shard's leader
// publishes its own jobs' endpoints in etcd, one key a job:
//
//   <region prefix>services/<shard>/<job>   the Service as agents get it (services.h)
//
// and reads every other shard's, which its agents then answer DNS for as for its own
// (the same pushes, docs/services.md). A task reaches a service by name whichever shard
// runs it. What is read back is hostile input: parsed strictly (parse_service), a key
// or value that does not parse is skipped and logged.
//
// Rounds are driven by the Manager (every tick): publish what changed since the last
// round (puts and deletes, in transactions of at most 64 operations), then read the
// others; and by a watch of the prefix (PrefixWatch): another shard's change is read at
// once, not at the next tick. A shard whose leader is gone leaves its last endpoints in place: its
// tasks run on, so they are still where they were.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/result.h"
#include "common/services.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/prefix_watch.h"

namespace weft::cp {

class RegionServices {
 public:
  using Services = std::map<std::string, Service>;
  struct Hooks {
    std::function<Services()> local;      // this shard's own services now
    std::function<void(Services)> apply;  // every other shard's, as last read
  };
  static Result<std::unique_ptr<RegionServices>> create(EventLoop& loop, const CpConfig& cfg,
                                                        Hooks hooks);
  void round();
  size_t published() const { return published_.size(); }
  size_t foreign() const { return foreign_; }

 private:
  RegionServices(std::string prefix, std::string shard, Hooks hooks)
      : prefix_(std::move(prefix)), shard_(std::move(shard)), hooks_(std::move(hooks)) {}
  std::string key(const std::string& job) const {
    return prefix_ + "services/" + shard_ + "/" + job;
  }
  std::string prefix_, shard_;
  Hooks hooks_;
  std::unique_ptr<EtcdWorker> etcd_;
  std::unique_ptr<PrefixWatch> watch_;
  std::map<std::string, std::string> published_;  // job -> the value in etcd
  bool busy_ = false;                             // a round in flight
  size_t foreign_ = 0;
  uint64_t errors_ = 0;
};

}  // namespace weft::cp
