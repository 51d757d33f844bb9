#include "controlplane/scheduling/allocator.h"

#include <algorithm>
#include <climits>
#include <map>

namespace weft::cp {

namespace {
constexpr uint32_t kAny = UINT32_MAX;
constexpr uint32_t kUnknown = UINT32_MAX - 1;  // a label no machine has
}  // namespace

uint32_t Allocator::intern(const std::string& s) {
  auto [it, added] = names_.emplace(s, static_cast<uint32_t>(names_.size()));
  return it->second;
}

MachineId Allocator::add_machine(const MachineSpec& spec) {
  Machine m;
  m.spec = spec;
  m.free = spec.capacity;
  m.domain = intern(spec.domain);
  m.dc = intern(spec.dc);
  m.type = intern(spec.type);
  m.ports.set(spec.port_first, spec.port_last, {});
  machines_.push_back(std::move(m));
  auto id = static_cast<MachineId>(machines_.size() - 1);
  pool_insert(id);
  return id;
}

void Allocator::set_ports(MachineId id, uint16_t first, uint16_t last,
                          const std::vector<uint16_t>& reserved) {
  Machine& m = machines_.at(id);
  m.spec.port_first = first;
  m.spec.port_last = last;
  m.ports.set(first, last, reserved);
}

void Allocator::pool_insert(MachineId id) {
  Machine& m = machines_[id];
  Pool& p = pools_[m.ent];
  auto& bucket = p.by_domain[m.domain];
  if (bucket.empty()) p.order.push_back(m.domain);
  m.slot = static_cast<uint32_t>(bucket.size());
  bucket.push_back(id);
  ++p.size;
  if (!m.holds_slot) ++p.slotless;
}

void Allocator::pool_erase(MachineId id) {
  Machine& m = machines_[id];
  Pool& p = pools_[m.ent];
  auto& bucket = p.by_domain[m.domain];
  MachineId last = bucket.back();
  bucket[m.slot] = last;
  machines_[last].slot = m.slot;
  bucket.pop_back();
  --p.size;
  if (!m.holds_slot) --p.slotless;
  if (bucket.empty()) {
    p.by_domain.erase(m.domain);
    p.order.erase(std::find(p.order.begin(), p.order.end(), m.domain));
    if (p.cursor >= p.order.size()) p.cursor = 0;
  }
}

void Allocator::set_usable(MachineId id, bool healthy, bool profile_ready,
                           std::optional<bool> holds_quota_slot) {
  Machine& m = machines_.at(id);
  bool slot = holds_quota_slot.value_or(healthy);
  if (m.holds_slot != slot) pools_[m.ent].slotless += slot ? -1 : 1;
  m.holds_slot = slot;
  m.healthy = healthy;
  m.ready = profile_ready;
}

Allocator::PoolCount Allocator::pool(EntitlementId e) const {
  auto it = pools_.find(e);
  if (it == pools_.end()) return {};
  return {it->second.size, it->second.size - it->second.slotless};
}

Status Allocator::assign(MachineId id, EntitlementId e) {
  if (id >= machines_.size()) return field_error("machine", "no such machine");
  Machine& m = machines_[id];
  if (m.ent == e) return {};
  if (m.tasks - m.guests > 0)  // guests do not keep a machine where it is
    return field_error("machine", m.spec.name + " still runs " +
                                      std::to_string(m.tasks - m.guests) +
                                      " task(s) of its entitlement");
  pool_erase(id);
  m.ent = e;
  pool_insert(id);
  moved_.push_back(id);
  return {};
}

bool Allocator::usable_for(const Machine& m, const Request&, uint32_t dc, uint32_t type) const {
  return m.healthy && m.ready && (dc == kAny || m.dc == dc) && (type == kAny || m.type == type);
}

void Allocator::place(const Request& r, size_t count, const std::vector<MachineId>& staying,
                      std::vector<MachineId>* out_p, std::vector<MachineId>* joined_p) {
  auto lookup = [&](const std::string& s) {
    if (s.empty()) return kAny;
    auto it = names_.find(s);
    return it == names_.end() ? kUnknown : it->second;
  };
  uint32_t dc = lookup(r.dc), type = lookup(r.machine_type);

  std::vector<MachineId>& out = *out_p;
  std::vector<MachineId>& joined = *joined_p;
  const size_t tasks = out.size() + count;
  // This job's tasks per domain and per machine: those that stay, and those placed now.
  std::unordered_map<uint32_t, int> in_domain;
  std::unordered_map<MachineId, int> on_machine, taken;  // taken: placed by this call
  for (MachineId id : staying) {
    ++in_domain[machines_[id].domain];
    ++on_machine[id];
  }
  size_t quota = SIZE_MAX;
  if (auto q = quotas_.find(r.entitlement); q != quotas_.end()) quota = q->second;
  auto fits = [&](MachineId id) {
    const Machine& m = machines_[id];
    if (!usable_for(m, r, dc, type)) return false;
    Resources avail = m.free;
    if (!r.opportunistic) {  // a guest's room is anyone else's to take back
      avail.cpu_milli += m.guest.cpu_milli;
      avail.mem_mb += m.guest.mem_mb;
    }
    auto t = taken.find(id);
    int n = t == taken.end() ? 0 : t->second;
    avail.cpu_milli -= r.per_task.cpu_milli * n;
    avail.mem_mb -= r.per_task.mem_mb * n;
    return avail.fits(r.per_task) && m.ports.fit(r.fixed_ports, r.dynamic_ports, n);
  };
  // One pass over a pool's domains (from its cursor), placing up to `per_domain` of
  // this job's tasks in each and up to `per_machine` on each machine. `capped` says
  // whether some domain stopped at its limit, `machine_capped` whether a machine that
  // had room was passed over for its limit (so higher limits could place more).
  struct PassResult {
    bool capped = false, machine_capped = false;
  };
  auto pass = [&](EntitlementId e, int per_domain, int per_machine) -> PassResult {
    PassResult res;
    auto pit = pools_.find(e);
    if (pit == pools_.end()) return res;
    Pool& pool = pit->second;
    size_t n = pool.order.size();
    for (size_t i = 0; i < n && out.size() < tasks; ++i) {
      uint32_t d = pool.order[(pool.cursor + i) % n];
      int& c = in_domain[d];
      const auto& bucket = pool.by_domain[d];
      size_t k = 0;
      while (out.size() < tasks) {
        if (c >= per_domain) {
          res.capped = true;
          break;
        }
        for (; k < bucket.size(); ++k) {
          if (!fits(bucket[k])) continue;
          if (on_machine[bucket[k]] >= per_machine) {
            res.machine_capped = true;
            continue;
          }
          break;
        }
        if (k == bucket.size()) break;  // nothing more fits in this domain
        MachineId id = bucket[k];
        if (e == kFreePool && taken[id] == 0 && !r.opportunistic) {  // a guest joins nothing
          if (this->pool(r.entitlement).quota_members + joined.size() >= quota)
            return res;  // at quota
          joined.push_back(id);
        }
        ++taken[id];
        ++on_machine[id];
        ++c;
        out.push_back(id);
        // Spreading, the next task goes to the next machine; packing, to the same one
        // while it fits.
        if (r.spread) ++k;
      }
    }
    if (n) pool.cursor = (pool.cursor + 1) % n;
    return res;
  };
  if (r.opportunistic) {
    // A guest: its own entitlement's room, then the free pool's, then every other
    // entitlement's, one task a machine first (spread), then as many as fit.
    std::vector<EntitlementId> pools = {r.entitlement, kFreePool};
    for (const auto& [e, pool] : pools_)
      if (e != r.entitlement && e != kFreePool) pools.push_back(e);
    for (int per_machine : {r.spread ? 1 : INT_MAX, INT_MAX})
      for (EntitlementId e : pools)
        if (out.size() < tasks) pass(e, INT_MAX, per_machine);
    return;
  }
  if (!r.spread) {
    // Packing: stack on the entitlement's machines; take free machines for the rest.
    pass(r.entitlement, INT_MAX, INT_MAX);
    if (out.size() < tasks) pass(kFreePool, INT_MAX, INT_MAX);
    return;
  }
  // Spreading: one task per domain and per machine, over the entitlement's machines and
  // the free ones it may take (within its quota) alike; then two per domain, and so on;
  // a machine takes a second task of the job only when no machine without one fits.
  for (int per_machine = 1; out.size() < tasks; ++per_machine) {
    bool machine_capped = false;
    for (int per_domain = 1; out.size() < tasks; ++per_domain) {
      PassResult own = pass(r.entitlement, per_domain, per_machine);
      PassResult free = pass(kFreePool, per_domain, per_machine);
      machine_capped |= own.machine_capped || free.machine_capped;
      if (!own.capped && !free.capped) break;  // every domain is out of room at this cap
    }
    if (!machine_capped) break;  // a higher per-machine cap cannot help
  }
}

Result<Placement> Allocator::allocate(const Request& r) {
  if (r.job.empty()) return field_error("job", "a request needs a job id");
  if (r.tasks < 1) return field_error("tasks", "must be at least 1");
  if (r.per_task.cpu_milli < 0 || r.per_task.mem_mb < 0)
    return field_error("resources", "must not be negative");
  if (r.entitlement == kFreePool) return field_error("entitlement", "jobs run in an entitlement");

  // The job-level cache: an unchanged request gets its placement back without work.
  Held* old = nullptr;
  if (auto it = jobs_.find(r.job); it != jobs_.end()) {
    if (it->second.req.generation == r.generation && it->second.req.per_task == r.per_task &&
        static_cast<int>(it->second.machines.size()) == r.tasks)
      return Placement{it->second.machines, {}, true};
    old = &it->second;  // a new generation replaces it, but only once the new one fits
  }

  const auto tasks = static_cast<size_t>(r.tasks);
  std::vector<MachineId> out, joined;
  place(r, tasks, {}, &out, &joined);
  if (out.size() < tasks)
    return make_error("job " + r.job + " does not fit: " + std::to_string(out.size()) + " of " +
                      std::to_string(r.tasks) + " tasks placed" + ports_taken(r))
        .wrap("allocate");

  if (old) (void)release(r.job);
  for (MachineId id : joined) (void)assign(id, r.entitlement);  // free machines hold no tasks
  Held& h = jobs_[r.job];
  h = Held{r, out, {}, {}};
  for (size_t i = 0; i < out.size(); ++i) hold(h, i, out[i]);
  if (!r.opportunistic)
    for (MachineId id : out) take_back(id);
  changed_.insert(r.job);
  return Placement{std::move(out), std::move(joined), false};
}

Result<Placement> Allocator::move_tasks(const std::string& job, const std::vector<int>& indices) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return field_error("job", "job " + job + " holds no placement");
  Held& h = it->second;
  std::vector<bool> moving(h.machines.size(), false);
  for (int i : indices) {
    if (i < 0 || static_cast<size_t>(i) >= h.machines.size())
      return field_error("task", "job " + job + " has no task " + std::to_string(i));
    moving[static_cast<size_t>(i)] = true;
  }
  // Free the moving tasks' resources, then place that many again, spread against the
  // tasks that stay. Machines the broker marked unusable are not candidates.
  std::vector<MachineId> staying;
  std::vector<std::vector<uint16_t>> had = h.dynamic;
  std::vector<bool> was_evicted(h.machines.size(), false);  // held nothing already
  for (size_t i = 0; i < h.machines.size(); ++i) {
    was_evicted[i] = evicted(h, i);
    if (moving[i])
      unhold(h, i);
    else
      staying.push_back(h.machines[i]);
  }
  size_t count = 0;
  for (bool mv : moving) count += mv;
  std::vector<MachineId> out, joined;
  place(h.req, count, staying, &out, &joined);
  if (out.size() < count) {
    for (size_t i = 0; i < h.machines.size(); ++i) {  // all or nothing: take them back
      if (!moving[i]) continue;
      if (was_evicted[i])
        h.evicted[i] = true;  // still without room: it waits
      else
        hold(h, i, h.machines[i], i < had.size() ? &had[i] : nullptr);
    }
    return make_error("job " + job + ": " + std::to_string(out.size()) + " of " +
                      std::to_string(count) + " tasks could be moved")
        .wrap("allocate");
  }
  for (MachineId id : joined) (void)assign(id, h.req.entitlement);  // free machines hold no tasks
  size_t k = 0;
  for (size_t i = 0; i < h.machines.size(); ++i) {
    if (!moving[i]) continue;
    MachineId id = out[k++];
    h.machines[i] = id;
    hold(h, i, id);
    if (!h.req.opportunistic) take_back(id);
  }
  changed_.insert(job);
  return Placement{h.machines, std::move(joined), false};
}

Status Allocator::move_task_to(const std::string& job, int index, MachineId to) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return field_error("job", "job " + job + " holds no placement");
  Held& h = it->second;
  if (index < 0 || static_cast<size_t>(index) >= h.machines.size())
    return field_error("task", "job " + job + " has no task " + std::to_string(index));
  if (to >= machines_.size()) return field_error("machine", "no such machine");
  const size_t i = static_cast<size_t>(index);
  if (h.machines[i] == to) return field_error("machine", "the task is on that machine already");
  const Machine& m = machines_[to];
  auto lookup = [&](const std::string& s) {
    if (s.empty()) return kAny;
    auto n = names_.find(s);
    return n == names_.end() ? kUnknown : n->second;
  };
  if (m.ent != h.req.entitlement)
    return field_error("machine", m.spec.name + " is not a machine of the job's entitlement");
  if (!usable_for(m, h.req, lookup(h.req.dc), lookup(h.req.machine_type)))
    return field_error("machine", m.spec.name + " cannot take the job's tasks now");
  if (!m.free.fits(h.req.per_task))
    return field_error("machine", m.spec.name + " has no room for the task");
  if (!m.ports.fit(h.req.fixed_ports, h.req.dynamic_ports, 0))
    return field_error("machine", m.spec.name + " lacks the ports the task needs");
  unhold(h, i);
  h.machines[i] = to;
  hold(h, i, to);
  changed_.insert(job);
  return {};
}

Result<Placement> Allocator::resize(const std::string& job, int tasks) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return field_error("job", "job " + job + " holds no placement");
  if (tasks < 1) return field_error("tasks", "must be at least 1");
  Held& h = it->second;
  auto want = static_cast<size_t>(tasks);
  changed_.insert(job);  // (on failure too: a job marked changed is written as it is)
  if (want < h.machines.size()) {
    for (size_t i = want; i < h.machines.size(); ++i) unhold(h, i);
    h.machines.resize(want);
    if (h.dynamic.size() > want) h.dynamic.resize(want);
  } else if (want > h.machines.size()) {
    std::vector<MachineId> out, joined;
    size_t count = want - h.machines.size();
    place(h.req, count, h.machines, &out, &joined);
    if (out.size() < count)
      return make_error("job " + job + ": " + std::to_string(out.size()) + " of " +
                        std::to_string(count) + " more tasks fit")
          .wrap("allocate");
    for (MachineId id : joined) (void)assign(id, h.req.entitlement);  // free machines hold no tasks
    for (MachineId id : out) {
      h.machines.push_back(id);
      hold(h, h.machines.size() - 1, id);
    }
    if (!h.req.opportunistic)
      for (MachineId id : out) take_back(id);
    h.req.tasks = tasks;
    return Placement{h.machines, std::move(joined), false};
  }
  h.req.tasks = tasks;
  return Placement{h.machines, {}, false};
}

std::vector<MachineId> Allocator::placement(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? std::vector<MachineId>{} : it->second.machines;
}

std::optional<Request> Allocator::request(const std::string& job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.req;
}

Status Allocator::restore(const Request& r, const std::vector<MachineId>& machines,
                          const std::vector<std::vector<uint16_t>>& dynamic) {
  if (jobs_.count(r.job)) return field_error("job", "job " + r.job + " is already placed");
  for (MachineId id : machines)
    if (id >= machines_.size()) return field_error("machine", "no machine " + std::to_string(id));
  Held& h = jobs_[r.job];
  h = Held{r, machines, {}};
  for (size_t i = 0; i < machines.size(); ++i)
    hold(h, i, machines[i], i < dynamic.size() ? &dynamic[i] : nullptr);
  return {};
}

void Allocator::restore_evicted(const std::string& job, int index, MachineId machine) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || !it->second.req.opportunistic || index < 0) return;
  Held& h = it->second;
  const size_t i = static_cast<size_t>(index);
  if (i >= h.machines.size() || h.machines[i] != machine || evicted(h, i)) return;
  unhold(h, i);
  if (h.evicted.size() < h.machines.size()) h.evicted.resize(h.machines.size(), false);
  h.evicted[i] = true;
}

std::string Allocator::ports_taken(const Request& r) const {
  if (r.fixed_ports.empty()) return "";
  // The machines the job could use (its entitlement's and the free pool's): how many
  // hold each of its fixed ports, so the operator learns which port is in the way.
  size_t usable = 0;
  std::map<uint16_t, size_t> held;
  for (const Machine& m : machines_) {
    if (!m.healthy || !m.ready || (m.ent != r.entitlement && m.ent != kFreePool)) continue;
    ++usable;
    for (uint16_t p : r.fixed_ports)
      if (m.ports.taken(p)) ++held[p];
  }
  std::string out;
  for (const auto& [port, n] : held)
    out += "; port " + std::to_string(port) + " is taken (by a task, or the machine's own) on " +
           std::to_string(n) + " of " + std::to_string(usable) + " machines it could use";
  return out + "; a fixed port allows one task of the job per machine";
}

void Allocator::take_back(MachineId id) {
  Machine& m = machines_[id];
  if (m.guests == 0 || (m.free.cpu_milli >= 0 && m.free.mem_mb >= 0)) return;
  // The newest guests leave first (the end of the job table's order is as good as any;
  // what matters is that only as many leave as the room needs).
  for (auto& [name, h] : jobs_) {
    if (!h.req.opportunistic) continue;
    for (size_t i = 0; i < h.machines.size(); ++i) {
      if (h.machines[i] != id || evicted(h, i)) continue;
      unhold(h, i);
      if (h.evicted.size() < h.machines.size()) h.evicted.resize(h.machines.size(), false);
      h.evicted[i] = true;
      evictions_.push_back(Eviction{name, static_cast<int>(i), id});
      changed_.insert(name);
      if (m.free.cpu_milli >= 0 && m.free.mem_mb >= 0) return;
    }
  }
}

void Allocator::hold(Held& h, size_t i, MachineId id, const std::vector<uint16_t>* known) {
  Machine& m = machines_[id];
  m.free -= h.req.per_task;
  ++m.tasks;
  if (h.req.opportunistic) {
    m.guest.cpu_milli += h.req.per_task.cpu_milli;
    m.guest.mem_mb += h.req.per_task.mem_mb;
    ++m.guests;
  }
  if (i < h.evicted.size()) h.evicted[i] = false;
  for (uint16_t p : h.req.fixed_ports) m.ports.claim(p);
  if (h.dynamic.size() <= i) h.dynamic.resize(i + 1);
  std::vector<uint16_t>& mine = h.dynamic[i];
  mine.clear();
  const size_t want = static_cast<size_t>(std::max(0, h.req.dynamic_ports));
  if (known && known->size() == want) {
    bool free = true;
    for (uint16_t p : *known) free = free && p != 0 && !m.ports.claimed(p);
    if (free) {
      for (uint16_t p : *known) m.ports.claim(p);
      mine = *known;
      return;
    }
  }
  mine = m.ports.take(want);
}

void Allocator::unhold(Held& h, size_t i) {
  if (evicted(h, i)) {  // its room was taken back: it holds nothing
    h.evicted[i] = false;
    return;
  }
  Machine& m = machines_[h.machines[i]];
  m.free += h.req.per_task;
  --m.tasks;
  if (h.req.opportunistic) {
    m.guest.cpu_milli -= h.req.per_task.cpu_milli;
    m.guest.mem_mb -= h.req.per_task.mem_mb;
    --m.guests;
  }
  for (uint16_t p : h.req.fixed_ports) m.ports.release(p);
  if (i < h.dynamic.size()) {
    for (uint16_t p : h.dynamic[i]) m.ports.release(p);
    h.dynamic[i].clear();
  }
}

std::vector<std::vector<uint16_t>> Allocator::dynamic_ports(const std::string& job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  auto out = it->second.dynamic;
  out.resize(it->second.machines.size());
  return out;
}

std::vector<uint16_t> Allocator::dynamic_ports(const std::string& job, int index) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || index < 0 || static_cast<size_t>(index) >= it->second.dynamic.size())
    return {};
  return it->second.dynamic[static_cast<size_t>(index)];
}

std::vector<MachineId> Allocator::release(const std::string& job) {
  std::vector<MachineId> empty;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return empty;
  for (size_t i = 0; i < it->second.machines.size(); ++i) {
    unhold(it->second, i);
    if (machines_[it->second.machines[i]].tasks == 0) empty.push_back(it->second.machines[i]);
  }
  jobs_.erase(it);
  changed_.insert(job);
  return empty;
}

std::vector<MachineId> Allocator::shrink(EntitlementId e) {
  auto pit = pools_.find(e);
  if (e == kFreePool || pit == pools_.end()) return {};
  std::vector<MachineId> idle;
  for (const auto& [d, bucket] : pit->second.by_domain)
    for (MachineId id : bucket)
      if (machines_[id].tasks == 0 && !pinned_.count(id)) idle.push_back(id);
  for (MachineId id : idle) (void)assign(id, kFreePool);
  return idle;
}

}  // namespace weft::cp
