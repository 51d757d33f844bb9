#include "controlplane/machines/broker.h"

#include <algorithm>
#include <utility>

namespace weft::cp {

Broker::Machine* Broker::get(const std::string& machine) {
  auto it = machines_.find(machine);
  return it == machines_.end() ? nullptr : &it->second;
}

std::optional<MachineId> Broker::find(const std::string& machine) const {
  auto it = machines_.find(machine);
  if (it == machines_.end()) return std::nullopt;
  return it->second.id;
}

Result<MachineId> Broker::register_machine(const MachineInfo& info, uint64_t now) {
  if (info.id.empty()) return field_error("machine", "a machine needs an id");
  if (info.capacity.cpu_milli <= 0 || info.capacity.mem_mb <= 0)
    return field_error("capacity", "cpu and memory must be positive");
  now_ = std::max(now_, now);
  if (Machine* m = get(info.id)) {
    beat(*m, now);
    if (m->unprepared_until) {  // registered again (restarted, repaired): tried anew
      m->unprepared_until = 0;
      unprepared_.erase(m->id);
    }
    if (m->removed) {
      m->removed = false;
      log_.record({now, info.id, "back", "registered again after machine rm"});
    }
    if (m->dead) {
      m->dead = false;
      log_.record({now, info.id, "back", "registered again"});
    }
    m->info.port_first = info.port_first;
    m->info.port_last = info.port_last;
    m->info.reserved_ports = info.reserved_ports;
    alloc_.set_ports(m->id, info.port_first, info.port_last, info.reserved_ports);
    refresh(*m);
    return m->id;
  }
  Machine m;
  m.info = info;
  m.id = alloc_.add_machine(
      {info.id, info.dc, info.domain, info.type, info.capacity, info.port_first, info.port_last});
  alloc_.set_ports(m.id, info.port_first, info.port_last, info.reserved_ports);
  beat(m, now);
  by_index_.resize(m.id + 1);
  by_index_[m.id] = info.id;
  auto [it, added] = machines_.emplace(info.id, std::move(m));
  (void)added;
  refresh(it->second);
  return it->second.id;
}

Status Broker::heartbeat(const std::string& machine, uint64_t now) {
  Machine* m = get(machine);
  if (!m) return field_error("machine", "unknown machine " + machine + "; register first");
  now_ = std::max(now_, now);
  beat(*m, now);
  m->removed = false;
  if (m->dead) {
    m->dead = false;
    log_.record({now, machine, "back", "heartbeats resumed"});
  }
  refresh(*m);
  return {};
}

const std::string& Broker::verdict_of(MachineId m) const {
  return machines_.at(by_index_.at(m)).verdict;
}

Status Broker::health(const std::string& machine, const std::string& verdict, uint64_t now) {
  if (verdict != "ok" && verdict != "degraded" && verdict != "failed" && verdict != "unknown")
    return field_error("verdict", "must be ok, degraded, failed or unknown");
  Machine* m = get(machine);
  if (!m) return field_error("machine", "unknown machine " + machine);
  now_ = std::max(now_, now);
  if (verdict == "failed" && m->verdict != "failed")
    log_.record({now, machine, "failed", "HCS verdict failed"});
  m->verdict = verdict;
  refresh(*m);
  return {};
}

Status Broker::profile_applied(const std::string& machine, const std::string& profile) {
  Machine* m = get(machine);
  if (!m) return field_error("machine", "unknown machine " + machine);
  bool changed = m->applied_profile != profile;
  m->applied_profile = profile;
  if (m->unprepared_until && profile == m->unprepared_profile) {  // it could after all
    m->unprepared_until = 0;
    unprepared_.erase(m->id);
  }
  refresh(*m);
  // The machine may have joined an entitlement and been told its profile between two
  // refreshes, so refresh() saw no transition: a new profile that makes it usable wakes
  // the tasks waiting for it all the same (starting them twice is not possible).
  if (changed && was_usable_[m->id] && alloc_.entitlement_of(m->id) != kFreePool)
    ready_.push_back(m->id);
  return {};
}

Status Broker::drain(const std::string& machine, bool drained, uint64_t now) {
  Machine* m = get(machine);
  if (!m) return field_error("machine", "unknown machine " + machine);
  if (m->drained != drained)
    log_.record({now, machine, drained ? "drain" : "back", drained ? "drained" : "undrained"});
  m->drained = drained;
  refresh(*m);
  return {};
}

Broker::Persisted Broker::persisted(MachineId id) const {
  const Machine& m = machines_.at(by_index_.at(id));
  return Persisted{m.info, m.drained, m.applied_profile, m.removed};
}

bool Broker::profile_ready(const Machine& m) const {
  std::string want = desired_profile(m.id);
  return want.empty() || m.applied_profile == want;  // "" = any profile will do
}

bool Broker::profile_ready(MachineId id) const {
  return profile_ready(machines_.at(by_index_.at(id)));
}

std::string Broker::desired_profile(MachineId m) const {
  if (auto h = held_profile_.find(m); h != held_profile_.end()) return h->second;
  auto it = ents_.find(alloc_.entitlement_of(m));
  return it == ents_.end() ? "" : it->second.profile;
}

bool Broker::usable(MachineId id) const {
  const Machine& m = machines_.at(by_index_.at(id));
  return !m.dead && !m.drained && m.unprepared_until <= now_ &&
         (m.verdict == "ok" || m.verdict == "degraded");
}

bool Broker::healthy(MachineId id) const {
  const Machine& m = machines_.at(by_index_.at(id));
  return !m.dead && (m.verdict == "ok" || m.verdict == "degraded");
}

std::string Broker::state_of(MachineId id) const {
  const Machine& m = machines_.at(by_index_.at(id));
  if (m.removed) return "removed";
  if (m.dead) return "dead";
  if (m.drained) return "drained";
  if (m.verdict == "failed") return "failed";
  if (m.verdict == "unknown") return "unknown";
  if (m.unprepared_until > now_) return "unprepared";
  if (!profile_ready(m)) return "preparing";
  return m.verdict;
}

void Broker::refresh(Machine& m) {
  // A machine marked unprepared takes nothing until the mark ends.
  bool unprepared = m.unprepared_until > now_;
  bool healthy =
      !m.dead && !m.drained && !unprepared && (m.verdict == "ok" || m.verdict == "degraded");
  // Free machines take any profile when they join; a machine in an entitlement takes
  // tasks once it runs that entitlement's profile.
  bool in_entitlement = alloc_.entitlement_of(m.id) != kFreePool;
  bool ready = !in_entitlement || profile_ready(m);
  // Preparing: counted from the first refresh that saw it so (take_unprepared).
  if (in_entitlement && !ready && !m.dead && !m.drained && !unprepared)
    preparing_.try_emplace(m.id, now_);
  else
    preparing_.erase(m.id);
  // A machine whose health is merely not known yet (the control plane just restarted)
  // keeps its quota slot; a dead, failed, drained or unprepared one gives it to its
  // replacement.
  bool holds_slot = !m.dead && !m.drained && !unprepared && m.verdict != "failed";
  alloc_.set_usable(m.id, healthy, ready, holds_slot);
  bool now_usable = healthy && ready;
  auto it = was_usable_.find(m.id);
  bool before = it != was_usable_.end() && it->second;
  // A drain is not a failure: the scheduler moves a drained machine's tasks gracefully
  // (machine_drain), rather than treating them as lost.
  // Its tasks are lost when it stops being usable, and also when it is found failed or
  // dead while it was not usable yet: its first verdict after a restart (every verdict is
  // unknown then) or a verdict while it prepares its profile. Once per loss.
  bool lost = m.dead || m.verdict == "failed";
  if (!m.drained && !healthy && (before || (lost && !lost_.count(m.id)))) failed_.push_back(m.id);
  if (lost)
    lost_.insert(m.id);
  else
    lost_.erase(m.id);
  if (!before && now_usable) ready_.push_back(m.id);
  was_usable_[m.id] = now_usable;
}

void Broker::beat(Machine& m, uint64_t now) {
  m.last_heartbeat = now;
  beats_.emplace_back(now, m.id);
}

uint64_t Broker::lease_end_us(MachineId id) const {
  const Machine& m = machines_.at(by_index_.at(id));
  return m.last_heartbeat + cfg_.lease() + cfg_.lease_margin();
}

uint64_t Broker::dead_after_us() const {
  return cfg_.heartbeat_interval_us * static_cast<uint64_t>(cfg_.missed_heartbeats);
}

void Broker::declare_dead(Machine& m, uint64_t now, const std::string& why,
                          std::vector<MachineId>* dead) {
  m.dead = true;
  log_.record({now, m.info.id, "dead", why});
  dead->push_back(m.id);
  refresh(m);
}

void Broker::begin_failover_grace(uint64_t now) {
  restored_at_ = now;
  grace_until_ = now + std::max(cfg_.failover_grace_us, dead_after_us());
  // The restore's registrations are not heartbeats: those machines are judged when the
  // grace ends (below), and what they send from now on is queued as usual.
  std::erase_if(beats_, [now](const auto& b) { return b.first <= now; });
}

void Broker::expect(MachineId id, uint64_t until) {
  Machine& m = machines_.at(by_index_.at(id));
  std::erase_if(beats_,
                [&](const auto& b) { return b.second == id && b.first <= m.last_heartbeat; });
  expected_[id] = {m.last_heartbeat, until};
}

void Broker::excuse_silence_until(uint64_t now) {
  excused_until_ = std::max(excused_until_, now);
}

std::vector<MachineId> Broker::check(uint64_t now) {
  now_ = std::max(now_, now);
  std::vector<MachineId> dead;
  uint64_t limit = dead_after_us();
  if (grace_until_ && now >= grace_until_) {
    // The grace is over: a machine silent since the restore is dead.
    for (auto& [name, m] : machines_) {
      if (m.dead || m.last_heartbeat > restored_at_) continue;
      declare_dead(m, now, "not back after the control plane's restart", &dead);
    }
    grace_until_ = 0;
  }
  for (auto it = expected_.begin(); it != expected_.end();) {
    Machine& m = machines_.at(by_index_.at(it->first));
    if (m.last_heartbeat != it->second.first || m.dead || m.removed) {
      it = expected_.erase(it);  // heard from (its heartbeats are queued as usual), or gone
    } else if (now >= it->second.second) {
      declare_dead(m, now, "not arrived from the shard it moved from", &dead);
      it = expected_.erase(it);
    } else {
      ++it;
    }
  }
  // Heartbeats in the order they came: only those older than the limit are looked at,
  // and a machine is dead when the oldest of them was its last. The cost follows the
  // heartbeats, not the fleet.
  while (!beats_.empty()) {
    auto [at, id] = beats_.front();
    // Silence counts from the later of the heartbeat and the end of the control plane's
    // own stall; heartbeats are in order, so once one is within the limit all later are.
    uint64_t since = std::max(at, excused_until_);
    if (now <= since || now - since <= limit) break;
    beats_.pop_front();
    Machine& m = machines_.at(by_index_.at(id));
    if (m.dead || m.last_heartbeat != at) continue;  // heard from since, or dead already
    declare_dead(m, now, std::to_string(cfg_.missed_heartbeats) + " heartbeats missed", &dead);
  }
  // refresh() also queued them as failed; they are reported here once.
  if (!dead.empty()) {
    std::set<MachineId> d(dead.begin(), dead.end());
    std::erase_if(failed_, [&](MachineId x) { return d.count(x) > 0; });
  }
  return dead;
}

std::vector<MachineId> Broker::take_failed() {
  return std::exchange(failed_, {});
}

std::vector<MachineId> Broker::take_unprepared(uint64_t now) {
  now_ = std::max(now_, now);
  std::vector<MachineId> out;
  for (auto it = preparing_.begin(); it != preparing_.end();) {
    if (now < it->second || now - it->second < cfg_.prepare_timeout_us) {
      ++it;
      continue;
    }
    out.push_back(it->first);
    it = preparing_.erase(it);
  }
  for (auto it = unprepared_.begin(); it != unprepared_.end();) {
    Machine& m = machines_.at(by_index_.at(*it));
    if (m.unprepared_until > now) {
      ++it;
      continue;
    }
    m.unprepared_until = 0;  // the hold is over: it may be lent and prepare again
    it = unprepared_.erase(it);
    refresh(m);
  }
  return out;
}

void Broker::mark_unprepared(MachineId id, const std::string& why, uint64_t now) {
  now_ = std::max(now_, now);
  Machine& m = machines_.at(by_index_.at(id));
  m.unprepared_until = now + cfg_.unprepared_hold_us;
  m.unprepared_profile = desired_profile(id);
  m.unprepared_reason = why;
  unprepared_.insert(id);
  log_.record({now, m.info.id, "unprepared", why});
  refresh(m);
}

Status Broker::remove(const std::string& machine, uint64_t now, const char* left_for) {
  Machine* m = get(machine);
  if (!m) return field_error("machine", "unknown machine " + machine);
  if (m->removed) return {};
  if (left_for) {  // it went to another control plane of the region, alive
    m->dead = true;
    m->removed = true;
    log_.record({now, machine, "removed", left_for});
    refresh(*m);
    return {};
  }
  if (!m->dead)
    return field_error("machine", "machine " + machine + " is " + state_of(m->id) +
                                      ", not dead: only a machine that is gone is removed "
                                      "(stop its daemons, or drain it, first)");
  m->removed = true;
  log_.record({now, machine, "removed", "machine rm"});
  refresh(*m);
  return {};
}

void Broker::set_removed(MachineId id, bool removed) {
  Machine& m = machines_.at(by_index_.at(id));
  m.removed = removed;
  if (removed) m.dead = true;
  refresh(m);
}

bool Broker::removed(MachineId id) const {
  return machines_.at(by_index_.at(id)).removed;
}

std::string Broker::unprepared_reason(MachineId id) const {
  const Machine& m = machines_.at(by_index_.at(id));
  return m.unprepared_until > now_ ? m.unprepared_reason : "";
}

std::vector<MachineId> Broker::take_ready(const std::set<MachineId>* moved) {
  // A machine that joined an entitlement after the last refresh is re-evaluated: it is
  // ready once its profile matches.
  if (!moved)
    for (auto& [id, m] : machines_) refresh(m);
  else
    for (MachineId id : *moved)
      if (id < by_index_.size()) refresh(machines_.at(by_index_[id]));
  auto out = std::exchange(ready_, {});
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace weft::cp
