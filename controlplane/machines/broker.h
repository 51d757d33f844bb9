// The Resource Broker (Twine §2.4): the machine inventory, each machine's health and
// availability, and the entitlements machines belong to. Pure state: the daemon feeds it
// what machines say (register, heartbeats, HCS verdicts, sidekick's applied profile) and
// the time; it tells the allocator which machines may take new tasks and tells the
// caller which machines went down, so the scheduler replaces their tasks.
//
// A machine takes new tasks only when it is alive (a heartbeat within
// missed_heartbeats x heartbeat interval), healthy (its HCS verdict is ok or degraded),
// not drained for maintenance, and running its entitlement's host profile. Machines
// that fail or die produce unavailability events; so does a drain.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "controlplane/entitlements/entitlement_table.h"
#include "controlplane/machines/unavailability_log.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

struct MachineInfo {
  std::string id;  // the agent's machine id
  std::string dc, domain, type;
  Resources capacity;
  uint16_t port_first = 20000, port_last = 32767;  // the agent's port_range
  // The machine's own ports (its listeners, weft's, its reserved_ports): no task's.
  std::vector<uint16_t> reserved_ports;
};

struct BrokerConfig {
  uint64_t heartbeat_interval_us = 2'000'000;
  int missed_heartbeats = 3;
  // After this control plane restores the state (a restart, a new leader): a machine it
  // has not heard from since is not dead before this long. Its agent was cut off by the
  // restart, not by a failure, and reconnects with a backoff (up to 30 s and a quarter).
  uint64_t failover_grace_us = 60'000'000;
  // A machine lent to an entitlement that has not applied its profile this long after
  // it began preparing is marked unprepared (take_unprepared): no task waits on it.
  uint64_t prepare_timeout_us = 120'000'000;
  // How long the mark holds unless its sidekick applies the profile (or the machine
  // registers again) sooner: the machine takes no tasks meanwhile.
  uint64_t unprepared_hold_us = 3'600'000'000;
  // The machine's lease (docs/jobs.md, "At most one copy"): granted by every call of its
  // agent this control plane hears; its agent stops the tasks of at-most-one jobs when it
  // has had no answer for fence_after, and those tasks start elsewhere only after
  // lease_us plus lease_margin() since the control plane last heard the machine. 0: the
  // defaults below (4 heartbeat intervals, at least 4 s; half of that).
  uint64_t lease_us = 0, fence_after_us = 0;
  uint64_t lease() const {
    return lease_us ? lease_us : std::max<uint64_t>(4 * heartbeat_interval_us, 4'000'000);
  }
  uint64_t fence_after() const { return fence_after_us ? fence_after_us : lease() / 2; }
  // The clocks' rates may differ: the machine's lease, counted on its monotonic clock from
  // when it sent the call, ends first as long as the two clocks' rates differ by less
  // than 1% (NTP slews a clock by at most 500 ppm; a crystal is off by tens of ppm), and
  // 100 ms more for the control plane's own reading of the time.
  uint64_t lease_margin() const { return lease() / 100 + 100'000; }
};

class Broker {
 public:
  Broker(Allocator& alloc, BrokerConfig cfg = {}) : alloc_(alloc), cfg_(cfg), ents_(alloc) {}

  // Idempotent: a machine registering again (agent restart) keeps its id and pool.
  Result<MachineId> register_machine(const MachineInfo& info, uint64_t now_us);
  Status heartbeat(const std::string& machine, uint64_t now_us);
  // HCS's verdict: "ok", "degraded", "failed" or "unknown".
  Status health(const std::string& machine, const std::string& verdict, uint64_t now_us);
  // Sidekick reports the profile it has applied.
  Status profile_applied(const std::string& machine, const std::string& profile);
  Status drain(const std::string& machine, bool drained, uint64_t now_us);

  // Its entitlements (entitlements/entitlement_table.h): what a machine's profile is.
  EntitlementTable& entitlements() { return ents_; }
  const EntitlementTable& entitlements() const { return ents_; }
  // A profile roll (entitlement.update --profile): machines held at `profile` keep it as
  // their desired one until released, a few at a time.
  void hold_profile(MachineId m, std::string profile) { held_profile_[m] = std::move(profile); }
  void release_profile(MachineId m) { held_profile_.erase(m); }
  bool profile_held(MachineId m) const { return held_profile_.count(m) > 0; }
  // Applied what it should run now (or it may run any).
  bool profile_ready(MachineId m) const;
  // What the store keeps of a machine.
  struct Persisted {
    MachineInfo info;
    bool drained = false;
    std::string applied_profile;
    bool removed = false;
    bool pinned = false;  // the allocator's (machine.assign); filled in by the daemon
  };
  Persisted persisted(MachineId m) const;
  // The profile a machine should run now (its entitlement's), for sidekick.
  std::string desired_profile(MachineId m) const;

  // Machines whose heartbeats stopped since the last call (dead now); call it every
  // heartbeat interval. Together with health(), the machines to hand to
  // Scheduler::machine_down.
  std::vector<MachineId> check(uint64_t now_us);
  // The state was just restored (every machine registered at `now_us`): machines not
  // heard from again are judged at now + max(failover grace, the dead-machine timeout),
  // not at the usual timeout. Machines heard from since are judged as usual.
  void begin_failover_grace(uint64_t now_us);
  // The control plane itself was not listening until `now_us` (its loop held up by a
  // slow etcd write, the process paused): what machines sent meanwhile waits unread, so
  // their silence is counted from `now_us` at the earliest, not from their last heartbeat.
  void excuse_silence_until(uint64_t now_us);
  // A machine that came with an entitlement from another shard of the region (its
  // daemons are on their way from that shard): not dead before `until_us` unless heard
  // from meanwhile, then judged as usual.
  void expect(MachineId m, uint64_t until_us);
  // Machines that became unusable through health() since the last call.
  std::vector<MachineId> take_failed();
  // Machines preparing (lent to an entitlement, its profile not applied) for longer than
  // prepare_timeout at `now`: the caller marks them (mark_unprepared) and moves what
  // waits on them. Also ends marks whose hold is over. Costs the machines preparing.
  std::vector<MachineId> take_unprepared(uint64_t now_us);
  // The machine takes no tasks and holds no quota slot until its sidekick applies
  // `profile` (the one it failed to), it registers again, or the hold ends; `why` is
  // shown by machine ls and recorded as an "unprepared" event.
  void mark_unprepared(MachineId m, const std::string& why, uint64_t now_us);
  // Why it is marked ("" when it is not).
  std::string unprepared_reason(MachineId m) const;
  // An operator forgets a machine that is gone (weftctl machine rm): only a dead one.
  // It is listed no more and takes nothing; registering or beating again brings it back
  // (a machine that returns is a machine). Its id keeps its place (MachineId).
  // `left_for`: a region's machine that went, alive, to another control plane (the
  // reason recorded); removed whether dead or not.
  Status remove(const std::string& machine, uint64_t now_us, const char* left_for = nullptr);
  // After a restart (it was removed), or to undo a remove() that could not be stored.
  void set_removed(MachineId m, bool removed);
  bool removed(MachineId m) const;
  // Machines that became usable again (profile applied, back alive) since the last call:
  // the scheduler may start what waited for them. With `moved` (machines whose
  // entitlement changed) only those and machines whose own reports changed them get a
  // look: no scan of the fleet.
  std::vector<MachineId> take_ready(const std::set<MachineId>* moved = nullptr);

  std::optional<MachineId> find(const std::string& machine) const;
  // Alive and its HCS verdict ok or degraded, drained or not (what planned maintenance
  // waits for before it returns a machine to service).
  bool healthy(MachineId m) const;
  bool usable(MachineId m) const;
  // The machines' unavailability events (unavailability_log.h).
  UnavailabilityLog& unavailability() { return log_; }
  const UnavailabilityLog& unavailability() const { return log_; }
  std::string state_of(MachineId m)
      const;  // "ok", "degraded", "failed", "dead", "drained", "preparing", "unprepared"
  // HCS's last verdict of machine m ("unknown" until one came).
  const std::string& verdict_of(MachineId m) const;
  // When the lease this control plane granted machine m ends, drift margin included
  // (BrokerConfig::lease_margin): the earliest moment a task of an at-most-one job that
  // ran there may start elsewhere. Counted from the last time the machine was heard (a
  // registration, a report, a heartbeat), which is never before its agent sent it.
  uint64_t lease_end_us(MachineId m) const;
  const BrokerConfig& config() const { return cfg_; }

 private:
  struct Machine {
    MachineInfo info;
    MachineId id = 0;
    uint64_t last_heartbeat = 0;
    std::string verdict = "unknown";
    std::string applied_profile;
    bool dead = false, drained = false;
    bool removed = false;           // remove()
    uint64_t unprepared_until = 0;  // mark_unprepared
    std::string unprepared_profile, unprepared_reason;
  };
  void refresh(Machine& m);
  void beat(Machine& m, uint64_t now);  // a heartbeat (or registration) at `now`
  // How long a machine may be silent before it is dead (missed_heartbeats intervals).
  uint64_t dead_after_us() const;
  // Marks `m` dead at `now` for `why` (an unavailability event) and appends it to `dead`.
  void declare_dead(Machine& m, uint64_t now, const std::string& why, std::vector<MachineId>* dead);
  bool profile_ready(
      const Machine& m) const;  // pushes usability to the allocator, notes transitions
  Machine* get(const std::string& machine);

  Allocator& alloc_;
  BrokerConfig cfg_;
  std::map<std::string, Machine> machines_;  // by machine id
  std::vector<std::string> by_index_;        // MachineId -> machine id
  EntitlementTable ents_;
  std::map<MachineId, std::string> held_profile_;  // hold_profile
  std::map<MachineId, bool> was_usable_;
  std::map<MachineId, uint64_t> preparing_;           // machines preparing, and since when
  std::set<MachineId> unprepared_;                    // marked (mark_unprepared)
  uint64_t now_ = 0;                                  // the latest time any call was given
  std::set<MachineId> lost_;                          // failed or dead, and reported so (refresh)
  std::deque<std::pair<uint64_t, MachineId>> beats_;  // heartbeats, oldest first
  // begin_failover_grace(): when it began, when it ends (0: none under way).
  uint64_t restored_at_ = 0, grace_until_ = 0;
  uint64_t excused_until_ = 0;  // excuse_silence_until()
  // expect(): the machine, when it was expected from, and until when.
  std::map<MachineId, std::pair<uint64_t, uint64_t>> expected_;
  std::vector<MachineId> failed_, ready_;
  UnavailabilityLog log_;
};

}  // namespace weft::cp
