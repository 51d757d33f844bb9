// A region of several control-plane roles (docs/regions.md): what this process is in it
// ([region] in the configuration). The records the roles share in etcd are in
// region/records.h, the transactions on them in region/transactions.h, the thread that
// makes etcd calls for an event loop in region/etcd_worker.h, a watch of a prefix in
// region/prefix_watch.h. The records under the region's prefix:
//
//   <prefix>entitlements/<name>  {"shard": "s1"}              which shard owns it
//   <prefix>machines/<name>      {"holder": "s1", "epoch": 4}  which shard holds it
//   <prefix>moves/<name>         {"from": "s1", "to": "s2", "step": "export", ...}
//                                an entitlement moving between shards (at most one)
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/result.h"

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

}  // namespace weft::cp
