#include "controlplane/region/lending.h"

#include <algorithm>

#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/prefix_watch.h"
#include "controlplane/region/records.h"
#include "controlplane/region/transactions.h"

namespace weft::cp {

using json = nlohmann::json;

Result<std::unique_ptr<Lending>> Lending::create(EventLoop& loop, const CpConfig& cfg,
                                                 Hooks hooks) {
  std::unique_ptr<Lending> l(new Lending(loop, cfg, std::move(hooks)));
  TRY_ASSIGN(l->etcd_, EtcdWorker::create(loop, cfg.store.etcd.etcd));
  if (!l->broker()) {
    // The shard's link to each broker group: its hello and keepalive ask for nothing.
    json nothing{{"shard", cfg.region.shard}, {"count", 0}};
    auto hello = [nothing](rpc::Session& s, ControlPlaneLink::Done done) {
      s.call("pool.lend", nothing, [done](Result<json> r) {
        if (!r.ok()) return done(std::move(r));
        done(json{{"heartbeat_interval_ms", 1000}});
      });
    };
    auto report = [nothing](rpc::Session& s) { s.call("pool.lend", nothing, [](Result<json>) {}); };
    for (const auto& [group, endpoints] : cfg.region.brokers) {
      TRY_ASSIGN(
          l->groups_[group].link,
          make_control_plane_link(
              loop, endpoints, "shard " + cfg.region.shard + " (to broker group " + group + ")",
              &l->no_commands_, hello, report, cfg.insecure_listen, ControlPlaneTls{cfg.tls, ""}));
      l->groups_[group].link->start();
    }
  }
  return l;
}

Lending::Lending(EventLoop& loop, const CpConfig& cfg, Hooks hooks)
    : loop_(loop), region_(cfg.region), etcd_cfg_(cfg.store.etcd.etcd), hooks_(std::move(hooks)) {}

Lending::~Lending() {
  groups_.clear();
  etcd_.reset();
}

Status Lending::load() {
  // The start of a term, before anything is served: a synchronous read is allowed here
  // (as the state's own restore is).
  std::string base = region_.prefix + "machines/";
  TRY_ASSIGN(auto client, etcd::Client::create(etcd_cfg_));
  TRY_ASSIGN(auto kvs, client->range_prefix(base));
  std::map<std::string, MachineHolder> held;
  for (const auto& kv : kvs) {
    TRY_ASSIGN(MachineHolder h, parse_machine_holder(kv.key, kv.value));
    std::string name = kv.key.substr(base.size());
    TRY(check_machine_name(kv.key, name, true));
    // A broker: what its own group lent; a shard: what it holds.
    bool mine = broker() ? (h.broker.empty() ? "default" : h.broker) == region_.group
                         : h.holder == region_.shard;
    if (!h.holder.empty() && mine) held[name] = h;
  }
  holders_ = std::move(held);
  log_info("the region's machines read", {{"HELD", std::to_string(holders_.size())}});
  return {};
}

Status Lending::watch() {
  if (!broker() || watch_) return {};
  TRY_ASSIGN(watch_, PrefixWatch::create(loop_, etcd_cfg_, region_.prefix + "machines/",
                                         [this] { reread(); }));
  reread();
  return {};
}

void Lending::reread() {
  if (rereading_) return;
  rereading_ = true;
  std::string base = region_.prefix + "machines/";
  std::string group = region_.group;
  etcd_->post([this, base, group](etcd::Client& c) -> EtcdWorker::Then {
    int64_t rev = 0;
    auto kvs = c.range_prefix(base, &rev);
    std::map<std::string, MachineHolder> held;
    std::string why;
    if (kvs.ok())
      for (const auto& kv : *kvs) {
        auto h = parse_machine_holder(kv.key, kv.value);
        std::string name = kv.key.substr(base.size());
        if (!h.ok() || !check_machine_name(kv.key, name, true).ok()) {
          why = h.ok() ? "a machine's name is not valid: " + kv.key : h.error().str();
          continue;  // logged below; the rest is still read
        }
        if ((h->broker.empty() ? "default" : h->broker) == group) held[name] = *h;
      }
    else
      why = kvs.error().str();
    return [this, ok = kvs.ok(), held = std::move(held), why, rev] {
      rereading_ = false;
      if (!why.empty())
        log_warn("the region's machine holders were not all read", {{"ERROR", why}});
      if (!ok) {
        if (watch_) watch_->after(0);
        return;
      }
      // Merged by epoch: a lend or return this broker made after the read began is newer
      // than what the read saw (its own change wakes the watch again), so it stays.
      for (const auto& [m, h] : held) {
        auto it = holders_.find(m);
        if (it != holders_.end() && it->second.epoch > h.epoch) continue;
        if (h.holder.empty())
          holders_.erase(m);
        else
          holders_[m] = h;
      }
      if (watch_) watch_->after(rev);
    };
  });
}

void Lending::take_over(const std::vector<std::string>& machines, const std::string& from,
                        TakenOver done) {
  if (broker()) return done({}, "a broker takes over no machines", false);
  std::string prefix = region_.prefix, me = region_.shard;
  etcd_->post([this, machines, from, prefix, me, done](etcd::Client& c) -> EtcdWorker::Then {
    std::vector<std::pair<std::string, MachineHolder>> got;
    std::string why;
    bool retry = false;
    for (const auto& m : machines) {
      std::string key = machine_holder_key(prefix, m);
      auto now = c.get(key);
      if (!now.ok()) {
        why = now.error().str();
        retry = true;
        break;  // etcd unreachable: the move tries again
      }
      if (!*now) {
        why = "machine " + m + " has no holder record";
        continue;
      }
      auto h = parse_machine_holder(key, (*now)->value);
      if (!h.ok()) {
        why = h.error().str();
        continue;
      }
      if (h->holder == me) {
        got.emplace_back(m, *h);  // handed over by an earlier try
        continue;
      }
      if (h->holder != from) {
        why = "machine " + m + " is held by " + (h->holder.empty() ? "the free pool" : h->holder);
        continue;
      }
      auto next = transfer_machine(c, prefix, m, from, h->epoch, me);
      if (next.ok()) {
        got.emplace_back(m, *next);
      } else {
        why = next.error().str();
        retry = retry || next.error().code != rpc::kConflict;
      }
    }
    return [got, why, retry, done, this] {
      std::vector<std::string> held;
      for (const auto& [m, h] : got) {
        holders_[m] = h;
        held.push_back(m);
      }
      done(std::move(held), why, retry);
    };
  });
}

Status Lending::admit(const std::string& machine) const {
  auto it = holders_.find(machine);
  if (broker()) {
    if (it == holders_.end() || it->second.holder.empty()) return {};
    auto shard = region_.shards.find(it->second.holder);
    if (shard == region_.shards.end())
      return make_error("machine " + machine + " is held by shard " + it->second.holder +
                        ", which this broker's [region.shards] does not list")
          .with_code(rpc::kUnavailable);
    Error e = make_error("machine " + machine + " is held by shard " + it->second.holder)
                  .with_code(rpc::kMoved);
    e.leader = shard->second;
    return e;
  }
  if (groups_.empty() || it != holders_.end()) return {};
  return make_error("machine " + machine + " is not held by shard " + region_.shard +
                    ": it belongs to the region's brokers")
      .with_code(rpc::kMoved);
}

bool Lending::held_here(const std::string& machine) const {
  auto it = holders_.find(machine);
  return it != holders_.end() && !it->second.holder.empty();
}

json Lending::holder_of(const std::string& machine) const {
  if (broker()) return nullptr;
  auto it = holders_.find(machine);
  if (it == holders_.end() || it->second.holder != region_.shard) return nullptr;
  return json{{"shard", region_.shard}, {"epoch", it->second.epoch}};
}

void Lending::lend(const std::string& shard, size_t count, const std::set<std::string>& avoid,
                   rpc::ReplyFn reply) {
  if (count == 0) return reply(json{{"machines", json::array()}});
  std::vector<std::string> picked;
  for (auto& m : hooks_.lendable(count, avoid))
    if (!held_here(m)) picked.push_back(std::move(m));
  if (picked.empty()) return reply(json{{"machines", json::array()}});
  std::string prefix = region_.prefix;
  etcd_->post([this, prefix, shard, picked, reply](etcd::Client& c) -> EtcdWorker::Then {
    std::vector<std::pair<std::string, MachineHolder>> got;
    std::string why;
    for (const auto& m : picked) {
      auto h = lend_machine(c, prefix, m, shard, region_.group);
      if (h.ok())
        got.emplace_back(m, *h);
      else
        why = h.error().str();
    }
    return [this, shard, got, why, reply] {
      json out = json::array();
      for (const auto& [m, h] : got) {
        holders_[m] = h;
        ++lent_;
        hooks_.release(m);
        out.push_back({{"machine", m}, {"epoch", h.epoch}});
        log_info("machine lent",
                 {{"MACHINE", m}, {"SHARD", shard}, {"EPOCH", std::to_string(h.epoch)}});
      }
      if (!why.empty()) log_warn("a machine was not lent", {{"SHARD", shard}, {"ERROR", why}});
      reply(json{{"machines", out}});
    };
  });
}

void Lending::give_back(const std::string& shard, const std::string& machine, uint64_t epoch,
                        rpc::ReplyFn reply) {
  if (!holders_.count(machine)) {
    ++refused_;
    return reply(make_error("machine " + machine + " was not lent by broker group " +
                            region_.group + ": give it back to the group that lent it")
                     .with_code(rpc::kConflict));
  }
  std::string prefix = region_.prefix;
  etcd_->post([this, prefix, shard, machine, epoch, reply](etcd::Client& c) -> EtcdWorker::Then {
    auto r = return_machine(c, prefix, machine, shard, epoch);
    return [this, r, shard, machine, reply] {
      if (!r.ok()) {
        ++refused_;
        log_warn("a return was refused",
                 {{"MACHINE", machine}, {"SHARD", shard}, {"ERROR", r.error().str()}});
        return reply(r.error());
      }
      holders_.erase(machine);
      ++returned_;
      log_info("machine returned", {{"MACHINE", machine}, {"SHARD", shard}});
      reply(json{{"machine", machine}, {"epoch", r->epoch}});
    };
  });
}

std::string Lending::group_for(const std::string& dc) {
  if (auto it = groups_.find(dc); !dc.empty() && it != groups_.end())
    return it->second.link->session() ? dc : "";
  // Any datacenter: each connected group in turn.
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto it = std::next(groups_.begin(), static_cast<long>((turn_ + i) % groups_.size()));
    if (!it->second.link->session()) continue;
    turn_ = (turn_ + i + 1) % groups_.size();
    return it->first;
  }
  return "";
}

void Lending::round(uint64_t now_us) {
  if (broker() || groups_.empty()) return;
  std::map<std::string, long> need = hooks_.shortfall();
  for (auto it = arriving_.begin(); it != arriving_.end();) {
    const auto& [since, group] = it->second;
    if (hooks_.present(it->first) || now_us - since > kArrivalUs || !held_here(it->first)) {
      it = arriving_.erase(it);
      continue;
    }
    // On its way: counted against its group's datacenter, else against any.
    auto dc = need.find(group);
    --(dc != need.end() && dc->second > 0 ? dc->second : need[""]);
    ++it;
  }
  long total = 0;
  // The ReBalancer's wants: a datacenter whose quota still lacks machines borrows them
  // outside the crowded domains; one that lacks none borrows one such machine (a
  // swap: the entitlement gives back the machine it leaves, as a spare).
  std::map<std::string, std::set<std::string>> wanted;
  if (hooks_.wanted) wanted = hooks_.wanted();
  for (const auto& [dc, n] : need) {
    total += n;
    if (n <= 0) continue;
    std::string group = group_for(dc);
    if (group.empty() || groups_.at(group).asking) continue;
    auto w = wanted.find(dc);
    ask(group, static_cast<size_t>(std::min<long>(n, 64)),
        w == wanted.end() ? std::set<std::string>() : w->second);
    if (w != wanted.end()) wanted.erase(w);
  }
  for (const auto& [dc, avoid] : wanted) {
    if (auto next = wanted_next_.find(dc); next != wanted_next_.end() && now_us < next->second)
      continue;
    std::string group = group_for(dc);
    if (group.empty() || groups_.at(group).asking) continue;
    wanted_next_[dc] = now_us + kWantedEveryUs;
    ask(group, 1, avoid, &dc);
  }
  std::set<std::string> spare;
  if (total < 0) {
    for (auto& m : hooks_.spare())
      if (held_here(m) && spare.size() < static_cast<size_t>(-total)) spare.insert(m);
  }
  for (auto it = spare_since_.begin(); it != spare_since_.end();)
    it = spare.count(it->first) ? std::next(it) : spare_since_.erase(it);
  for (const auto& m : spare) {
    uint64_t since = spare_since_.emplace(m, now_us).first->second;
    if (now_us - since >= region_.return_idle_us && !giving_.count(m)) give(m, now_us);
  }
}

void Lending::ask(const std::string& group, size_t count, const std::set<std::string>& avoid,
                  const std::string* wanted_dc) {
  Group& g = groups_.at(group);
  g.asking = true;
  json params{{"shard", region_.shard}, {"count", count}};
  if (!avoid.empty()) params["avoid_domains"] = avoid;
  std::optional<std::string> want;
  if (wanted_dc) want = *wanted_dc;
  g.link->session()->call("pool.lend", params, [this, group, want](Result<json> r) {
    groups_.at(group).asking = false;
    json ms = r.ok() && r->is_object() && r->contains("machines") ? (*r)["machines"] : json();
    if (want && (!ms.is_array() || ms.empty()))  // none of another domain: asked again sooner
      wanted_next_[*want] = now_monotonic_us() + kWantedRetryUs;
    if (!r.ok()) {
      log_warn("the brokers lent nothing", {{"GROUP", group}, {"ERROR", r.error().str()}});
      return;
    }
    if (!ms.is_array()) return;
    for (const json& m : ms) {
      if (!m.is_object() || !m.contains("machine") || !m["machine"].is_string() ||
          !m.contains("epoch") || !m["epoch"].is_number_unsigned())
        continue;  // a broker's answer is checked like any other input
      std::string name = m["machine"].get<std::string>();
      if (!check_machine_name("machine", name, true).ok()) continue;
      holders_[name] = MachineHolder{region_.shard, m["epoch"].get<uint64_t>(), group};
      arriving_[name] = {now_monotonic_us(), group};
      ++lent_;
      log_info("machine borrowed", {{"MACHINE", name}, {"GROUP", group}});
    }
  });
}

void Lending::give(const std::string& machine, uint64_t) {
  auto it = holders_.find(machine);
  if (it == holders_.end()) return;
  // Back to the group that lent it (a record from before groups: "default").
  std::string group = it->second.broker.empty() ? "default" : it->second.broker;
  auto g = groups_.find(group);
  if (g == groups_.end()) {
    log_warn("a machine's broker group is not configured here: it is kept",
             {{"MACHINE", machine}, {"GROUP", group}});
    return;
  }
  if (!g->second.link->session()) return;
  giving_.insert(machine);
  // Nothing may be placed on it meanwhile: it leaves this shard first. Should the return
  // fail, its daemons come back (it is still held here) and it registers again.
  hooks_.release(machine);
  g->second.link->session()->call(
      "pool.return",
      json{{"shard", region_.shard}, {"machine", machine}, {"epoch", it->second.epoch}},
      [this, machine](Result<json> r) {
        giving_.erase(machine);
        spare_since_.erase(machine);
        if (!r.ok()) {
          ++refused_;
          log_warn("a machine was not given back",
                   {{"MACHINE", machine}, {"ERROR", r.error().str()}});
          return;
        }
        holders_.erase(machine);
        ++returned_;
        hooks_.release(machine);  // had its daemons come back meanwhile
        log_info("machine given back", {{"MACHINE", machine}});
      });
}

json Lending::status() const {
  json j{
      {"held", holders_.size()}, {"lent", lent_}, {"returned", returned_}, {"refused", refused_}};
  if (broker()) j["group"] = region_.group;
  for (const auto& [id, g] : groups_) j["brokers_connected"][id] = g.link->session() != nullptr;
  return j;
}

}  // namespace weft::cp
