// The allocator (Twine §3.2): an in-memory index of machines and their free resources,
// and the placement of a job's tasks onto them.
//
// Machines are either in the free pool or assigned to one entitlement (up to its quota,
// which does not count its dead, failed or drained machines: their slots go to their
// replacements). A placement spreads by default: one task of the job per fault domain
// and per machine, over the entitlement's machines and the free machines it may take
// alike (the entitlement's first at each step), then two per domain, and so on; a
// domain or a machine holds more than its share only when nothing else fits. A job
// that asks to be packed stacks on the entitlement's machines and takes free machines
// (which then join the entitlement) only for what does not fit there.
// Hard constraints (resources, machine type, DC pin, health, profile applied) filter.
// All or nothing: a job that does not fit changes nothing. A job-level cache answers an
// unchanged request (same job, same generation, placement still held) without work.
//
// The index is organised per pool (entitlement or free) and per fault domain, so a
// placement looks at a few machines per domain it uses, not at the fleet: its cost
// grows with the job's size, not the number of machines. Single-threaded; the scheduler
// serialises calls. Pure data structure: no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/result.h"
#include "controlplane/scheduling/machine_ports.h"

namespace weft::cp {

struct Resources {
  int64_t cpu_milli = 0;
  int64_t mem_mb = 0;
  bool fits(const Resources& need) const {
    return cpu_milli >= need.cpu_milli && mem_mb >= need.mem_mb;
  }
  Resources& operator+=(const Resources& o) {
    cpu_milli += o.cpu_milli;
    mem_mb += o.mem_mb;
    return *this;
  }
  Resources& operator-=(const Resources& o) {
    cpu_milli -= o.cpu_milli;
    mem_mb -= o.mem_mb;
    return *this;
  }
  bool operator==(const Resources&) const = default;
};

using MachineId = uint32_t;
using EntitlementId = uint32_t;
constexpr EntitlementId kFreePool = 0;

struct MachineSpec {
  std::string name;
  std::string dc;      // data centre (an entitlement may pin one)
  std::string domain;  // fault domain for spreading (MSB / rack)
  std::string type;    // machine type, a hard constraint when a job names one
  Resources capacity;
  // Where the ports a job leaves to the control plane (ports = { http = 0 }) are taken
  // from on this machine (the agent's port_range).
  uint16_t port_first = 20000, port_last = 32767;
};

struct Request {
  std::string job;
  uint64_t generation = 0;  // the job spec's generation: a new one is a new request
  EntitlementId entitlement = 1;
  int tasks = 1;
  Resources per_task;
  std::string machine_type;  // "" = any
  std::string dc;            // "" = any
  bool spread = true;        // spread over fault domains and machines (default), or pack
  // Ports (docs/services.md): fixed host ports each task claims (a machine holds at most
  // one claim of a port, so at most one task of such a job), and how many ports each
  // task takes from its machine's port range (chosen here, kept per task index).
  std::vector<uint16_t> fixed_ports;
  int dynamic_ports = 0;
  // A guest (an opportunistic batch job): placed on room nobody uses now, its own
  // entitlement's, the free pool's (the machines stay free) and other entitlements';
  // any other job's placement may take that room back (take_evictions).
  bool opportunistic = false;
};

// A guest's task whose room a placement took back: it must leave its machine (with its
// job's notice) and is placed again elsewhere.
struct Eviction {
  std::string job;
  int index = 0;
  MachineId machine = 0;
};

struct Placement {
  std::vector<MachineId> machines;  // one per task, in task order
  std::vector<MachineId> joined;    // machines that moved from the free pool
  bool cached = false;
};

class Allocator {
 public:
  // Machines join the free pool, healthy and ready.
  MachineId add_machine(const MachineSpec& spec);
  const MachineSpec& spec(MachineId m) const { return machines_.at(m).spec; }
  // The machine's agent registered (again): its port_range, where new ports come from
  // (ports held keep their numbers), and its own ports, on which no fixed port is placed
  // and none of the range is handed out (what a task holds already stays its own).
  void set_ports(MachineId m, uint16_t first, uint16_t last, const std::vector<uint16_t>& reserved);
  size_t machine_count() const { return machines_.size(); }

  // A machine that is unhealthy (HCS verdict, missed heartbeats) or whose entitlement
  // profile is not applied yet gets no new tasks. One that does not hold a quota slot
  // (dead, failed, drained: its tasks must go elsewhere) is not counted against its
  // entitlement's quota; by default, that is every unhealthy machine.
  void set_usable(MachineId m, bool healthy, bool profile_ready,
                  std::optional<bool> holds_quota_slot = std::nullopt);
  // Moves an empty machine between pools (returning it to the free pool, or an
  // operator's assignment). Fails if it still runs tasks of another entitlement.
  Status assign(MachineId m, EntitlementId e);
  // Machines that changed pools since the last call (what the daemon must persist).
  std::vector<MachineId> take_moved() { return std::exchange(moved_, {}); }
  // Guests' tasks whose room placements took since the last call. Their resources are
  // no longer held (the placement that took them holds them); the task still runs until
  // its job is told, and its index is placed again by move_tasks.
  std::vector<Eviction> take_evictions() { return std::exchange(evictions_, {}); }
  // Jobs whose placement was made, changed or released since the last call.
  std::set<std::string> take_changed_jobs() { return std::exchange(changed_, {}); }
  EntitlementId entitlement_of(MachineId m) const { return machines_.at(m).ent; }
  // Healthy and ready (takes new tasks).
  bool usable(MachineId m) const { return machines_.at(m).healthy && machines_.at(m).ready; }
  Resources free(MachineId m) const { return machines_.at(m).free; }
  int tasks_on(MachineId m) const { return machines_.at(m).tasks; }

  // Places a job; on success the resources are held until release().
  Result<Placement> allocate(const Request& r);
  // Moves some of a placed job's tasks (by index) to other machines, e.g. off a machine
  // that failed (mark it unusable first) or is being drained. Spread counts the tasks
  // that stay. All or nothing; the tasks keep their indices.
  Result<Placement> move_tasks(const std::string& job, const std::vector<int>& indices);
  // Moves task `index` of a placed job to machine `to` of the job's entitlement (the
  // ReBalancer's choice): `to` must be usable for the job (dc, type), have room and the
  // job's ports. Nothing changes when it cannot.
  Status move_task_to(const std::string& job, int index, MachineId to);
  // Scales a placed job: adds tasks (spread against the ones it has, all or nothing) or
  // drops its highest-indexed ones. Existing tasks never move.
  Result<Placement> resize(const std::string& job, int tasks);
  // The machines a job holds, by task index (empty if none), and the request it was
  // placed with: what the control plane persists.
  std::vector<MachineId> placement(const std::string& job) const;
  std::optional<Request> request(const std::string& job) const;
  // The ports taken from its machine's range for each task index of a job (each of
  // r.dynamic_ports long; empty if none): what the control plane persists beside the
  // placement, so that a task keeps its ports across restarts.
  std::vector<std::vector<uint16_t>> dynamic_ports(const std::string& job) const;
  std::vector<uint16_t> dynamic_ports(const std::string& job, int index) const;
  // Whether machine m holds a claim of `port` (fixed or taken from its range).
  bool port_held(MachineId m, uint16_t port) const { return machines_.at(m).ports.claimed(port); }
  // Re-establishes a placement read back from the store after a restart, holding its
  // resources without placing anything anew; `dynamic` (per index, optional) the ports
  // its tasks had (an index without them, or whose ports another claim holds now, gets
  // new ones).
  Status restore(const Request& r, const std::vector<MachineId>& machines,
                 const std::vector<std::vector<uint16_t>>& dynamic = {});
  // After restore(): guest task `index` of `job`, on `machine`, had its room taken back
  // (its task is stopping, preempted): it holds nothing there again, as before.
  void restore_evicted(const std::string& job, int index, MachineId machine);
  // Frees everything a job holds; returns the machines that became empty.
  std::vector<MachineId> release(const std::string& job);
  // Returns empty machines of an entitlement to the free pool (but pinned ones); returns
  // them.
  std::vector<MachineId> shrink(EntitlementId e);
  // An operator's assignment (machine.assign): the machine stays in its entitlement,
  // empty or not, until released.
  void pin(MachineId m, bool on) {
    if (on)
      pinned_.insert(m);
    else
      pinned_.erase(m);
  }
  bool pinned(MachineId m) const { return pinned_.count(m) > 0; }
  // How many machines an entitlement's pool has, and how many of them count against its
  // quota (those holding a slot).
  struct PoolCount {
    size_t machines = 0, quota_members = 0;
  };
  PoolCount pool(EntitlementId e) const;
  // An entitlement's quota in machines: placement takes free machines only up to it.
  void set_quota(EntitlementId e, size_t machines) { quotas_[e] = machines; }
  // How many more machines the entitlement may take from the free pool (SIZE_MAX: no
  // quota set).
  size_t room(EntitlementId e) const {
    auto q = quotas_.find(e);
    if (q == quotas_.end()) return SIZE_MAX;
    size_t members = pool(e).quota_members;
    return q->second > members ? q->second - members : 0;
  }

 private:
  std::vector<MachineId> moved_;
  std::set<std::string> changed_;
  std::set<MachineId> pinned_;
  struct Machine {
    MachineSpec spec;
    Resources free;
    EntitlementId ent = kFreePool;
    uint32_t domain = 0, dc = 0, type = 0;  // interned
    uint32_t slot = 0;                      // position in its pool's domain bucket
    int tasks = 0;
    // What guests hold here (counted in `free` and `tasks` as well): room other jobs may
    // take back.
    Resources guest;
    int guests = 0;
    MachinePorts ports;
    bool healthy = true, ready = true, holds_slot = true;
  };
  struct Pool {
    // Per fault domain, the machines of this pool there; `order` lists the domains that
    // have any, for iteration; `cursor` rotates the starting domain between jobs so
    // successive jobs do not all start on the same domains.
    std::unordered_map<uint32_t, std::vector<MachineId>> by_domain;
    std::vector<uint32_t> order;
    size_t cursor = 0;
    size_t size = 0;
    size_t slotless = 0;  // machines that do not count against the quota
  };
  struct Held {
    Request req;
    std::vector<MachineId> machines;
    std::vector<std::vector<uint16_t>> dynamic;  // per index: ports from the range
    std::vector<bool> evicted;  // per index: a guest's, taken back (holds nothing now)
  };
  bool evicted(const Held& h, size_t i) const { return i < h.evicted.size() && h.evicted[i]; }
  // After a placement that is not a guest's put a task on machine id: guests there leave
  // until its resources are not overdrawn.
  void take_back(MachineId id);
  std::vector<Eviction> evictions_;
  // Task i of h on machine id (h.machines[i] = id): its resources and ports are held
  // there (`known`: the ports from the range it had, kept where still free).
  void hold(Held& h, size_t i, MachineId id, const std::vector<uint16_t>* known = nullptr);
  // Lets go of what task i of h holds on h.machines[i].
  void unhold(Held& h, size_t i);
  // Why a job with fixed ports did not fit, for its error: which of them are taken.
  std::string ports_taken(const Request& r) const;
  // Places `count` more tasks of `r` into *out, spreading against `staying` (the
  // machines of the job's tasks that stay where they are). Places as many as fit; the
  // caller checks that all did.
  void place(const Request& r, size_t count, const std::vector<MachineId>& staying,
             std::vector<MachineId>* out, std::vector<MachineId>* joined);
  uint32_t intern(const std::string& s);
  void pool_insert(MachineId m);
  void pool_erase(MachineId m);
  bool usable_for(const Machine& mc, const Request& r, uint32_t dc, uint32_t type) const;

  std::vector<Machine> machines_;
  std::unordered_map<std::string, uint32_t> names_;
  std::unordered_map<EntitlementId, Pool> pools_;
  std::unordered_map<std::string, Held> jobs_;
  std::unordered_map<EntitlementId, size_t> quotas_;
};

}  // namespace weft::cp
