// The records a region's roles share in etcd (docs/regions.md), each a key and a JSON
// value: an entitlement's home, a machine's holder, an entitlement's move between shards.
// Hostile input when read back (a corrupt or forged etcd): parsed strictly, refused with
// the key named.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/store/etcd_client.h"

namespace weft::cp {

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

}  // namespace weft::cp
