// The transactions on a region's records (controlplane/region/records.h), synchronous:
// from an EtcdWorker's thread or a tool. An entitlement's home is created only if absent,
// so two front ends cannot give one entitlement to two shards. A machine is lent and
// returned by transactions that compare the whole record read before, so two shards can
// never hold one machine, and every change of holder raises the epoch: a command that
// carries an older epoch is stale.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/result.h"
#include "controlplane/region/records.h"
#include "controlplane/store/etcd_client.h"

namespace weft::cp {

// What the region's calls refuse with when the records changed or say otherwise
// (rpc::kConflict): the caller may read again and retry.
Error conflict_error(const std::string& what);

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

}  // namespace weft::cp
