// The shard's side of a region (docs/regions.md): the calls its front ends carry.
#include "common/log.h"
#include "controlplane/daemon/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {

// The operator's certificate as a front end carries it ({"subject", "cn", "ou", "dns"}):
// hostile input like any parameter.
Status read_identity(const json& j, tls::Identity* id) {
  if (!j.is_object()) return field_error("caller.identity", "must be an object");
  auto text = [&](const char* key, std::string* out) -> Status {
    if (!j.contains(key)) return {};
    if (!j[key].is_string() || j[key].get_ref<const std::string&>().size() > 1024)
      return field_error(std::string("caller.identity.") + key, "must be a string");
    *out = j[key].get<std::string>();
    return {};
  };
  auto list = [&](const char* key, std::vector<std::string>* out) -> Status {
    if (!j.contains(key)) return {};
    const json& a = j[key];
    if (!a.is_array() || a.size() > 64)
      return field_error(std::string("caller.identity.") + key, "must be a list of strings");
    for (const json& v : a) {
      if (!v.is_string() || v.get_ref<const std::string&>().size() > 1024)
        return field_error(std::string("caller.identity.") + key, "must be a list of strings");
      out->push_back(v.get<std::string>());
    }
    return {};
  };
  TRY(text("subject", &id->subject));
  TRY(text("cn", &id->common_name));
  TRY(list("ou", &id->units));
  TRY(list("dns", &id->dns));
  if (id->subject.empty()) return field_error("caller.identity.subject", "is required");
  return {};
}

}  // namespace

bool Manager::front_end_call(const CallContext& c, const char* method) const {
  // Only a front end may speak for an operator: its certificate (access.front_end), or a
  // privileged peer on this host's Unix socket (root or the weft group: an admin already).
  Caller fe = caller(c);
  bool front_end = c.peer.via.empty() && (c.peer.tls ? cfg_.access.is_front_end(c.peer.identity)
                                                     : fe.unix_socket && fe.role == Role::kAdmin);
  if (!front_end)
    log_warn("call refused",
             {{"PEER", fe.who}, {"METHOD", method}, {"WHY", "not a front end (access.front_end)"}});
  return front_end;
}

Result<json> Manager::api_frontend_forward(const json& p, const CallContext& c) {
  Caller fe = caller(c);
  if (!front_end_call(c, "frontend.forward"))
    return make_error(fe.who +
                      ": frontend.forward is for a region's front ends (a certificate "
                      "matching access.front_end)")
        .with_code(rpc::kPermissionDenied);
  if (!p.is_object()) return field_error("params", "must be an object");
  if (!p.contains("method") || !p["method"].is_string())
    return field_error("method", "must be a method name");
  std::string method = p["method"].get<std::string>();
  if (method == "frontend.forward" || method.rfind("machine.register", 0) == 0 ||
      method == "machine.heartbeat" || method == "machine.report" || method == "health.report" ||
      method == "profile.report")
    return field_error("method", method + " cannot be carried by a front end");
  const rpc::Handler* h = server_.methods().find(method);
  if (!h) return make_error("no such method: " + method).with_code(rpc::kMethodNotFound);
  if (!p.contains("caller") || !p["caller"].is_object())
    return field_error("caller", "must name the operator");
  const json& who = p["caller"];
  if (!who.contains("role") || !who["role"].is_string())
    return field_error("caller.role", "must be viewer, operator or admin");
  rpc::Peer op;
  op.via = fe.who;
  op.via_role = who["role"].get<std::string>();
  if (parse_role(op.via_role) == Role::kNone)
    return field_error("caller.role", "must be viewer, operator or admin");
  if (who.contains("identity")) {
    TRY(read_identity(who["identity"], &op.identity));
    op.tls = true;
  } else {
    if (!who.contains("who") || !who["who"].is_string() ||
        who["who"].get_ref<const std::string&>().size() > 256)
      return field_error("caller.who", "must name the operator");
    op.address = who["who"].get<std::string>();
  }
  json params = p.contains("params") ? p["params"] : json::object();
  return (*h)(params, CallContext{c.session, op});
}

}  // namespace weft::cp

namespace weft::cp {

Result<std::string> Manager::calling_shard(const json& p, const CallContext& c) const {
  if (!p.is_object() || !p.contains("shard") || !p["shard"].is_string())
    return field_error("shard", "must name the calling shard");
  std::string shard = p["shard"].get<std::string>();
  TRY(check_shard_id("shard", shard));
  Caller who = caller(c);
  bool ok = c.peer.via.empty() && (c.peer.tls ? cfg_.access.is_shard(c.peer.identity) &&
                                                    c.peer.identity.common_name == shard
                                              : who.unix_socket && who.role == Role::kAdmin);
  if (!ok) {
    log_warn("call refused",
             {{"PEER", who.who}, {"METHOD", "pool"}, {"WHY", "not shard " + shard}});
    return make_error(who.who + ": only shard " + shard +
                      " may borrow or give back its machines (a certificate matching "
                      "access.shard whose CN is the shard's id)")
        .with_code(rpc::kPermissionDenied);
  }
  return shard;
}

Result<json> Manager::api_pool_lend(const json& p, const CallContext& c) {
  if (cfg_.region.role != RegionRole::kBroker || !region_.lending)
    return make_error("pool.lend is served by a region's broker").with_code(rpc::kUnsupported);
  TRY_ASSIGN(std::string shard, calling_shard(p, c));
  if (!cfg_.region.shards.count(shard))
    return field_error("shard", "no shard " + shard + " in this broker's [region.shards]");
  if (!p.contains("count") || !p["count"].is_number_unsigned() || p["count"].get<uint64_t>() > 1000)
    return field_error("count", "must be a number of machines from 0 to 1000");
  std::set<std::string> avoid;
  if (p.contains("avoid_domains")) {
    const json& a = p["avoid_domains"];
    if (!a.is_array() || a.size() > 256)
      return field_error("avoid_domains", "must be a list of at most 256 fault domains");
    for (const auto& d : a) {
      if (!d.is_string()) return field_error("avoid_domains", "must be a list of names");
      TRY(check_machine_name("avoid_domains", d.get<std::string>(), false));
      avoid.insert(d.get<std::string>());
    }
  }
  if (!c.session) return make_error("pool.lend is served on sessions only");
  region_.lending->lend(shard, p["count"].get<size_t>(), avoid, c.session->defer_reply());
  return json();
}

Result<json> Manager::api_pool_return(const json& p, const CallContext& c) {
  if (cfg_.region.role != RegionRole::kBroker || !region_.lending)
    return make_error("pool.return is served by a region's broker").with_code(rpc::kUnsupported);
  TRY_ASSIGN(std::string shard, calling_shard(p, c));
  if (!p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "must name a machine");
  std::string machine = p["machine"].get<std::string>();
  TRY(check_machine_name("machine", machine, true));
  if (!p.contains("epoch") || !p["epoch"].is_number_unsigned())
    return field_error("epoch", "must be the epoch the machine was lent at");
  if (!c.session) return make_error("pool.return is served on sessions only");
  region_.lending->give_back(shard, machine, p["epoch"].get<uint64_t>(), c.session->defer_reply());
  return json();
}

Result<json> Manager::api_region_move(const json& p, const CallContext& c) {
  if (cfg_.region.role != RegionRole::kShard || !region_.moves)
    return make_error("region.move is served by a region's shards").with_code(rpc::kUnsupported);
  if (!front_end_call(c, "region.move"))
    return make_error(caller(c).who +
                      ": region.move is for a region's front ends (a certificate matching "
                      "access.front_end)")
        .with_code(rpc::kPermissionDenied);
  if (!c.session) return make_error("region.move is served on sessions only");
  region_.moves->call(p, now_us(), c.session->defer_reply());
  return json();
}

Status Manager::load_moves() {
  if (cfg_.region.role != RegionRole::kShard) return {};
  if (!region_.checks) {
    TRY_ASSIGN(region_.checks, RegionChecks::create(*loop_, cfg_.store.etcd.etcd,
                                                    cfg_.region.prefix, cfg_.region.shard));
  }
  if (!region_.moves) {
    EntitlementMoves::Hooks h;
    h.persist = [this](const std::set<std::string>& jobs, const std::set<MachineId>& machines) {
      return persist(jobs, machines);
    };
    h.delete_entitlement = [this](EntitlementId e) -> Status {
      profile_rolls_.forget(e);
      TRY(group_->open());
      return store_->delete_entitlement(e);
    };
    h.forget_machine = [this](MachineId m, const char* why) -> Status {
      sessions_.close(m);
      return forget_machine(m, why);
    };
    h.lending = [this] { return region_.lending.get(); };
    h.kick = [this] { kick(); };
    h.fence_roll = [this](EntitlementId e, bool on) { profile_rolls_.fence(e, on); };
    h.roll_of = [this](EntitlementId e) {
      return profile_rolls_.moved(e, [this](MachineId m) { return machine_name(m); });
    };
    h.adopt_roll = [this](EntitlementId e, const ProfileRolls::Moved& r,
                          const std::map<std::string, MachineId>& ids) {
      profile_rolls_.adopt(e, r, [&ids](const std::string& name) -> std::optional<MachineId> {
        auto it = ids.find(name);
        if (it == ids.end()) return std::nullopt;
        return it->second;
      });
    };
    h.checks = [this] { return region_.checks.get(); };
    region_.moves = std::make_unique<EntitlementMoves>(cfg_, alloc_, broker_, sched_, std::move(h));
  }
  TRY(region_.moves->load(now_us()));
  group_->commit();
  return {};
}

Status Manager::start_region() {
  const RegionConfig& r = cfg_.region;
  if (r.role == RegionRole::kShard && !region_.services) {
    RegionServices::Hooks sh{
        [this] { return discovery_->local(); },
        [this](RegionServices::Services others) { discovery_->set_foreign(std::move(others)); }};
    TRY_ASSIGN(region_.services, RegionServices::create(*loop_, cfg_, std::move(sh)));
  }
  bool lends =
      r.role == RegionRole::kBroker || (r.role == RegionRole::kShard && !r.brokers.empty());
  if (!lends || region_.lending) return {};
  // Free machines in service that hold nothing: what a broker may lend, what a shard has
  // spare.
  auto free_empty = [this] {
    std::vector<MachineId> out;
    for (MachineId m = 0; m < alloc_.machine_count(); ++m)
      if (!broker_.removed(m) && alloc_.entitlement_of(m) == kFreePool && broker_.usable(m) &&
          !alloc_.pinned(m) && alloc_.tasks_on(m) == 0)
        out.push_back(m);
    return out;
  };
  Lending::Hooks h;
  h.lendable = [this, free_empty](size_t count, const std::set<std::string>& avoid) {
    // Spread over fault domains: one from each domain in turn, so that what a shard
    // borrows is not one rack; none of the domains it asked to avoid.
    std::map<std::string, std::vector<MachineId>> by_domain;
    for (MachineId m : free_empty())
      if (!avoid.count(alloc_.spec(m).domain)) by_domain[alloc_.spec(m).domain].push_back(m);
    std::vector<std::string> names;
    for (size_t i = 0; names.size() < count; ++i) {
      bool any = false;
      for (const auto& [domain, ms] : by_domain)
        if (i < ms.size() && names.size() < count) {
          names.push_back(alloc_.spec(ms[i]).name);
          any = true;
        }
      if (!any) break;
    }
    return names;
  };
  h.spare = [this, free_empty] {
    // Those in domains the ReBalancer finds crowded go back first: a machine it borrowed
    // for an entitlement's spread is kept for it.
    std::set<std::string> crowded;
    if (rebalancer_)
      for (const auto& [dc, domains] : rebalancer_->wanted())
        crowded.insert(domains.begin(), domains.end());
    std::vector<std::string> first, then;
    for (MachineId m : free_empty())
      (crowded.count(alloc_.spec(m).domain) ? first : then).push_back(alloc_.spec(m).name);
    first.insert(first.end(), then.begin(), then.end());
    return first;
  };
  h.wanted = [this] {
    return rebalancer_ ? rebalancer_->wanted() : std::map<std::string, std::set<std::string>>();
  };
  h.shortfall = [this, free_empty] {
    // What the quotas lack, by the entitlement's datacenter ("" = any), less the free
    // machines: each serves its own datacenter's need first, then any datacenter's.
    std::map<std::string, long> need;
    for (const auto& [id, e] : broker_.entitlements()) {
      size_t have = alloc_.quota_members(id);
      if (e.quota > have) need[e.dc] += static_cast<long>(e.quota - have);
    }
    std::map<std::string, long> free;
    for (MachineId m : free_empty()) ++free[alloc_.spec(m).dc];
    for (const char* pass : {"own", "any"})
      for (auto& [dc, n] : free) {
        long& want = need[std::string(pass) == "own" ? dc : ""];
        long use = std::min(n, std::max(0L, want));
        want -= use;
        n -= use;
      }
    for (const auto& [dc, n] : free) need[""] -= n;  // to spare
    return need;
  };
  h.present = [this](const std::string& name) {
    auto m = broker_.find(name);  // registered, and in service (counted as free)
    return m && !broker_.removed(*m) && broker_.usable(*m);
  };
  h.release = [this](const std::string& name) {
    auto m = broker_.find(name);
    if (!m) return;
    sessions_.close(*m);
    if (!broker_.removed(*m))
      if (auto s = forget_machine(*m, cfg_.region.role == RegionRole::kBroker
                                          ? "lent to a shard"
                                          : "given back to the brokers");
          !s.ok())
        log_warn("a machine that left was not forgotten",
                 {{"MACHINE", name}, {"ERROR", s.error().str()}});
  };
  TRY_ASSIGN(region_.lending, Lending::create(*loop_, cfg_, std::move(h)));
  TRY(region_.lending->load());
  return region_.lending->watch();  // a broker's: holders a move changed
}

}  // namespace weft::cp
