#include "controlplane/region/transactions.h"

#include <nlohmann/json.hpp>

#include "common/rpc/protocol.h"

namespace weft::cp {

using json = nlohmann::json;

Error conflict_error(const std::string& what) {
  return make_error(what).with_code(rpc::kConflict);
}

Status claim_entitlement_home(etcd::Client& c, const std::string& prefix, const std::string& name,
                              const std::string& shard) {
  std::string key = entitlement_home_key(prefix, name);
  etcd::Compare absent{etcd::Compare::Target::kCreate, key, 0, {}};
  etcd::Op put{etcd::Op::Kind::kPut, key, entitlement_home_value(shard), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({absent}, {put}));
  if (r.succeeded) return {};
  TRY_ASSIGN(auto now, c.get(key));
  if (!now) return conflict_error("entitlement " + name + " changed home meanwhile; try again");
  TRY_ASSIGN(std::string other, parse_entitlement_home(key, now->value));
  return conflict_error("entitlement " + name + " exists (its shard is " + other + ")");
}

Status drop_entitlement_home(etcd::Client& c, const std::string& prefix, const std::string& name,
                             const std::string& shard) {
  std::string key = entitlement_home_key(prefix, name);
  etcd::Compare mine{etcd::Compare::Target::kValue, key, 0, entitlement_home_value(shard)};
  etcd::Op del{etcd::Op::Kind::kDelete, key, {}, {}, 0};
  TRY(c.txn({mine}, {del}));
  return {};  // not this shard's (any more): nothing to drop
}

Result<std::map<std::string, MoveRead>> read_moves(etcd::Client& c, const std::string& prefix) {
  std::string base = prefix + "moves/";
  TRY_ASSIGN(auto kvs, c.range_prefix(base));
  std::map<std::string, MoveRead> out;
  for (const auto& kv : kvs) {
    std::string name = kv.key.substr(base.size());
    TRY(check_machine_name(kv.key, name, true));
    TRY_ASSIGN(MoveRecord m, parse_move(kv.key, kv.value));
    out[name] = {std::move(m), kv.value};
  }
  return out;
}

Status begin_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                  const MoveRecord& m) {
  std::string key = move_key(prefix, name);
  std::string home = entitlement_home_key(prefix, name);
  etcd::Compare none{etcd::Compare::Target::kCreate, key, 0, {}};
  etcd::Compare from{etcd::Compare::Target::kValue, home, 0, entitlement_home_value(m.from)};
  etcd::Op put{etcd::Op::Kind::kPut, key, move_value(m), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({none, from}, {put}));
  if (r.succeeded) return {};
  TRY_ASSIGN(auto under_way, c.get(key));
  if (under_way) {
    TRY_ASSIGN(MoveRecord other, parse_move(key, under_way->value));
    return conflict_error("entitlement " + name + " is moving already, from shard " + other.from +
                          " to " + other.to + " (step " + other.step + ")");
  }
  return conflict_error("entitlement " + name + " is not on shard " + m.from + " (any more)");
}

Status advance_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                    const std::string& read, const MoveRecord& next) {
  std::string key = move_key(prefix, name);
  std::vector<etcd::Compare> cmp{{etcd::Compare::Target::kValue, key, 0, read}};
  std::vector<etcd::Op> ops{{etcd::Op::Kind::kPut, key, move_value(next), {}, 0}};
  TRY_ASSIGN(MoveRecord before, parse_move(key, read));
  if (next.step == "release" && before.step == "export") {
    std::string home = entitlement_home_key(prefix, name);
    cmp.push_back({etcd::Compare::Target::kValue, home, 0, entitlement_home_value(next.from)});
    ops.push_back({etcd::Op::Kind::kPut, home, entitlement_home_value(next.to), {}, 0});
  }
  TRY_ASSIGN(etcd::TxnResult r, c.txn(cmp, ops));
  if (!r.succeeded)
    return conflict_error("the move of entitlement " + name +
                          " changed meanwhile (another front end)");
  return {};
}

Status end_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                const std::string& read) {
  std::string key = move_key(prefix, name);
  etcd::Compare same{etcd::Compare::Target::kValue, key, 0, read};
  etcd::Op del{etcd::Op::Kind::kDelete, key, {}, {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({same}, {del}));
  if (!r.succeeded)
    return conflict_error("the move of entitlement " + name +
                          " changed meanwhile (another front end)");
  return {};
}

Result<MachineHolder> lend_machine(etcd::Client& c, const std::string& prefix,
                                   const std::string& machine, const std::string& shard,
                                   const std::string& broker) {
  std::string key = machine_holder_key(prefix, machine);
  TRY_ASSIGN(auto now, c.get(key));
  MachineHolder next{shard, 1, broker};
  etcd::Compare cmp{etcd::Compare::Target::kCreate, key, 0, {}};
  if (now) {
    TRY_ASSIGN(MachineHolder h, parse_machine_holder(key, now->value));
    if (h.holder == shard) return h;  // already lent to this shard
    if (!h.holder.empty())
      return conflict_error("machine " + machine + " is held by shard " + h.holder);
    next.epoch = h.epoch + 1;
    cmp = {etcd::Compare::Target::kValue, key, 0, now->value};
  }
  etcd::Op put{etcd::Op::Kind::kPut, key, machine_holder_value(next), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({cmp}, {put}));
  if (!r.succeeded)
    return conflict_error("machine " + machine + " was taken by another shard meanwhile");
  return next;
}

namespace {

// `machine`'s holder record as stored (its value, and read), if `shard` holds it at
// `epoch`; else kConflict.
Result<std::pair<std::string, MachineHolder>> read_held(etcd::Client& c, const std::string& key,
                                                        const std::string& machine,
                                                        const std::string& shard, uint64_t epoch) {
  TRY_ASSIGN(auto now, c.get(key));
  if (!now) return conflict_error("machine " + machine + " was never lent");
  TRY_ASSIGN(MachineHolder held, parse_machine_holder(key, now->value));
  if (held.holder != shard || held.epoch != epoch)
    return conflict_error("machine " + machine + " is not held by shard " + shard + " at epoch " +
                          std::to_string(epoch));
  return std::pair{now->value, held};
}

// Writes `next` if the record is still `read` (the whole value compared: a lend, return or
// transfer meanwhile fails this one, with `conflict`).
Status replace_holder(etcd::Client& c, const std::string& key, const std::string& read,
                      const MachineHolder& next, const std::string& conflict) {
  etcd::Compare cmp{etcd::Compare::Target::kValue, key, 0, read};
  etcd::Op put{etcd::Op::Kind::kPut, key, machine_holder_value(next), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({cmp}, {put}));
  if (!r.succeeded) return conflict_error(conflict);
  return {};
}

}  // namespace

Result<MachineHolder> transfer_machine(etcd::Client& c, const std::string& prefix,
                                       const std::string& machine, const std::string& from,
                                       uint64_t epoch, const std::string& to) {
  TRY(check_shard_id("to", to));
  if (to == from) return field_error("to", "the machine is held by shard " + from + " already");
  std::string key = machine_holder_key(prefix, machine);
  TRY_ASSIGN(auto held, read_held(c, key, machine, from, epoch));
  MachineHolder next{to, epoch + 1, held.second.broker};
  TRY(replace_holder(c, key, held.first, next,
                     "machine " + machine + " changed holder meanwhile; try again"));
  return next;
}

Result<uint64_t> next_in_sequence(etcd::Client& c, const std::string& key) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    TRY_ASSIGN(auto now, c.get(key));
    uint64_t last = 0;
    etcd::Compare cmp{etcd::Compare::Target::kCreate, key, 0, {}};
    if (now) {
      const std::string& v = now->value;
      if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
        return field_error(key, "is not a sequence number");
      last = std::stoull(v);
      cmp = {etcd::Compare::Target::kValue, key, 0, v};
    }
    etcd::Op put{etcd::Op::Kind::kPut, key, std::to_string(last + 1), {}, 0};
    TRY_ASSIGN(etcd::TxnResult r, c.txn({cmp}, {put}));
    if (r.succeeded) return last + 1;  // else another took it: read again
  }
  return conflict_error("the sequence " + key + " is contended; try again");
}

Result<MachineHolder> return_machine(etcd::Client& c, const std::string& prefix,
                                     const std::string& machine, const std::string& shard,
                                     uint64_t epoch) {
  std::string key = machine_holder_key(prefix, machine);
  TRY_ASSIGN(auto held, read_held(c, key, machine, shard, epoch));
  MachineHolder free{"", epoch + 1, ""};
  TRY(replace_holder(c, key, held.first, free,
                     "machine " + machine + " is not held by shard " + shard + " at epoch " +
                         std::to_string(epoch)));
  return free;
}

}  // namespace weft::cp
