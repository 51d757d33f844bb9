// The shard's side of a region (docs/regions.md): the calls its front ends carry.
#include "controlplane/region/calls.h"
#include "common/log.h"

#include "controlplane/region/lending_policy.h"
#include "controlplane/region/region.h"

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

RegionCalls::RegionCalls(const ShardParts& s, MachineCalls& machines,
                         std::function<std::map<std::string, std::set<std::string>>()> wanted)
    : cfg_(s.cfg),
      loop_(s.loop),
      model_(s.model),
      profile_rolls_(s.profile_rolls),
      store_(s.store),
      group_(s.group),
      discovery_(s.discovery),
      region_(s.region),
      methods_(s.methods),
      fx_(s.fx),
      gate_(s.gate),
      machines_(machines),
      wanted_(std::move(wanted)) {}

Result<json> RegionCalls::frontend_forward(const json& p, const CallContext& c) {
  Caller fe = gate_.caller(c);
  if (!gate_.front_end_call(c, "frontend.forward"))
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
  const rpc::Handler* h = methods_.find(method);
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

Result<json> RegionCalls::pool_lend(const json& p, const CallContext& c) {
  if (cfg_.region.role != RegionRole::kBroker || !region_.lending)
    return make_error("pool.lend is served by a region's broker").with_code(rpc::kUnsupported);
  TRY_ASSIGN(std::string shard, gate_.calling_shard(p, c));
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

Result<json> RegionCalls::pool_return(const json& p, const CallContext& c) {
  if (cfg_.region.role != RegionRole::kBroker || !region_.lending)
    return make_error("pool.return is served by a region's broker").with_code(rpc::kUnsupported);
  TRY_ASSIGN(std::string shard, gate_.calling_shard(p, c));
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

Result<json> RegionCalls::region_move(const json& p, const CallContext& c) {
  if (cfg_.region.role != RegionRole::kShard || !region_.moves)
    return make_error("region.move is served by a region's shards").with_code(rpc::kUnsupported);
  if (!gate_.front_end_call(c, "region.move"))
    return make_error(gate_.caller(c).who +
                      ": region.move is for a region's front ends (a certificate matching "
                      "access.front_end)")
        .with_code(rpc::kPermissionDenied);
  if (!c.session) return make_error("region.move is served on sessions only");
  region_.moves->call(p, now_us(), c.session->defer_reply());
  return json();
}

Status RegionCalls::load_moves() {
  if (cfg_.region.role != RegionRole::kShard) return {};
  if (!region_.checks) {
    TRY_ASSIGN(region_.checks, RegionChecks::create(loop_, cfg_.store.etcd.etcd, cfg_.region.prefix,
                                                    cfg_.region.shard));
  }
  if (!region_.moves) {
    EntitlementMoves::Hooks h;
    h.persist = [this](const std::set<std::string>& jobs, const std::set<MachineId>& machines) {
      return fx_.persist(jobs, machines);
    };
    h.delete_entitlement = [this](EntitlementId e) -> Status {
      profile_rolls_.forget(e);
      TRY(group_->open());
      return store_->delete_entitlement(e);
    };
    h.forget_machine = [this](MachineId m, const char* why) -> Status {
      model_.sessions.close(m);
      return machines_.forget_machine(m, why);
    };
    h.lending = [this] { return region_.lending.get(); };
    h.kick = [this] { fx_.kick(); };
    h.fence_roll = [this](EntitlementId e, bool on) { profile_rolls_.fence(e, on); };
    h.roll_of = [this](EntitlementId e) {
      return profile_rolls_.moved(e, [this](MachineId m) { return fx_.machine_name(m); });
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
    region_.moves = std::make_unique<EntitlementMoves>(cfg_, model_.alloc, model_.broker,
                                                       model_.sched, std::move(h));
  }
  TRY(region_.moves->load(now_us()));
  group_->commit();
  return {};
}

Status RegionCalls::start_region() {
  const RegionConfig& r = cfg_.region;
  if (r.role == RegionRole::kShard && !region_.services) {
    RegionServices::Hooks sh{
        [this] { return discovery_->local(); },
        [this](RegionServices::Services others) { discovery_->set_foreign(std::move(others)); }};
    TRY_ASSIGN(region_.services, RegionServices::create(loop_, cfg_, std::move(sh)));
  }
  bool lends =
      r.role == RegionRole::kBroker || (r.role == RegionRole::kShard && !r.brokers.empty());
  if (!lends || region_.lending) return {};
  // Which machines go is the lending policy's (lending_policy.h); Lending moves them.
  Lending::Hooks h;
  h.lendable = [this](size_t count, const std::set<std::string>& avoid) {
    return lendable_machines(model_.alloc, model_.broker, count, avoid);
  };
  h.spare = [this] {
    std::set<std::string> crowded;
    for (const auto& [dc, domains] : wanted_()) crowded.insert(domains.begin(), domains.end());
    return spare_machines(model_.alloc, model_.broker, crowded);
  };
  h.wanted = [this] { return wanted_(); };
  h.shortfall = [this] { return quota_shortfall(model_.alloc, model_.broker); };
  h.present = [this](const std::string& name) { return machine_present(model_.broker, name); };
  h.release = [this](const std::string& name) {
    auto m = model_.broker.find(name);
    if (!m) return;
    model_.sessions.close(*m);
    if (!model_.broker.removed(*m))
      if (auto s = machines_.forget_machine(*m, cfg_.region.role == RegionRole::kBroker
                                                    ? "lent to a shard"
                                                    : "given back to the brokers");
          !s.ok())
        log_warn("a machine that left was not forgotten",
                 {{"MACHINE", name}, {"ERROR", s.error().str()}});
  };
  TRY_ASSIGN(region_.lending, Lending::create(loop_, cfg_, std::move(h)));
  TRY(region_.lending->load());
  return region_.lending->watch();  // a broker's: holders a move changed
}

void RegionCalls::register_calls(Calls& calls) {
  calls.add_plain("frontend.forward",
                  [this](const json& p, const CallContext& c) { return frontend_forward(p, c); });
  calls.add_plain("pool.lend",
                  [this](const json& p, const CallContext& c) { return pool_lend(p, c); });
  calls.add_plain("pool.return",
                  [this](const json& p, const CallContext& c) { return pool_return(p, c); });
  calls.add_plain("region.move",
                  [this](const json& p, const CallContext& c) { return region_move(p, c); });
}

}  // namespace weft::cp
