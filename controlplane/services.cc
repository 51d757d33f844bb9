#include "controlplane/services.h"

#include <algorithm>

namespace weft::cp {

namespace {

std::set<std::string> task_ids(const Service* s) {
  std::set<std::string> out;
  if (s)
    for (const auto& e : s->endpoints) out.insert(e.task);
  return out;
}

}  // namespace

const Service* ServiceTable::find(const std::string& job) const {
  auto it = services_.find(job);
  return it == services_.end() ? nullptr : &it->second;
}

uint64_t ServiceTable::changed_at(const std::string& job) const {
  auto it = changed_.find(job);
  return it == changed_.end() ? 0 : it->second;
}

std::vector<std::string> ServiceTable::set(const std::string& job, const Service& s) {
  const Service* old = find(job);
  if (old && *old == s) return {};
  std::set<std::string> before = task_ids(old), now = task_ids(&s);
  std::vector<std::string> left;
  std::set_difference(before.begin(), before.end(), now.begin(), now.end(),
                      std::back_inserter(left));
  services_[job] = s;
  if (auto c = changed_.find(job); c != changed_.end()) by_version_.erase(c->second);
  changed_[job] = ++version_;
  by_version_[version_] = job;
  return left;
}

std::vector<std::string> ServiceTable::erase(const std::string& job) {
  auto it = services_.find(job);
  if (it == services_.end()) return {};
  std::set<std::string> before = task_ids(&it->second);
  services_.erase(it);
  if (auto c = changed_.find(job); c != changed_.end()) {
    by_version_.erase(c->second);
    changed_.erase(c);
  }
  removed(job);
  return {before.begin(), before.end()};
}

void ServiceTable::removed(const std::string& job) {
  removals_[++version_] = job;
  while (removals_.size() > kRemembered) {
    forgotten_ = removals_.begin()->first;
    removals_.erase(removals_.begin());
  }
}

ServiceUpdate ServiceTable::update_since(uint64_t from) const {
  ServiceUpdate u;
  u.version = version_;
  if (from < forgotten_) {
    // Older than what is remembered of removals: the whole table.
    u.reset = true;
    for (const auto& [job, s] : services_) u.services[job] = s;
    return u;
  }
  for (auto it = by_version_.upper_bound(from); it != by_version_.end(); ++it)
    u.services[it->second] = services_.at(it->second);
  for (auto it = removals_.upper_bound(from); it != removals_.end(); ++it)
    if (!services_.count(it->second)) u.services[it->second] = std::nullopt;
  return u;
}

std::vector<ServiceUpdate> ServiceTable::snapshot(size_t per_chunk) const {
  std::vector<ServiceUpdate> out;
  per_chunk = std::max<size_t>(per_chunk, 1);
  ServiceUpdate cur;
  cur.version = version_;
  cur.reset = true;
  for (const auto& [job, s] : services_) {
    if (cur.services.size() == per_chunk) {
      out.push_back(std::move(cur));
      cur = ServiceUpdate{};
      cur.version = version_;
    }
    cur.services[job] = s;
  }
  out.push_back(std::move(cur));
  return out;
}

void ServiceTable::ack(MachineId m, uint64_t version) {
  auto it = acked_.find(m);
  if (it != acked_.end()) it->second = std::max(it->second, std::min(version, version_));
}

uint64_t ServiceTable::acked(MachineId m) const {
  auto it = acked_.find(m);
  return it == acked_.end() ? 0 : it->second;
}

uint64_t ServiceTable::everywhere() const {
  uint64_t low = version_;
  for (const auto& [m, v] : acked_) low = std::min(low, v);
  return low;
}

void ServiceTable::hold_stop(Command c, uint64_t version, uint64_t now, uint64_t ack_timeout_us,
                             uint64_t drain_us) {
  for (const auto& h : held_)
    if (h.command.task_id == c.task_id && h.command.machine == c.machine) return;  // once
  held_.push_back(Held{std::move(c), version, now + ack_timeout_us, drain_us, 0});
}

bool ServiceTable::holds(const std::string& task) const {
  return std::any_of(held_.begin(), held_.end(),
                     [&](const Held& h) { return h.command.task_id == task; });
}

ServiceTable::Released ServiceTable::release(uint64_t now) {
  Released out;
  const uint64_t low = everywhere();
  std::vector<Held> keep;
  for (auto& h : held_) {
    if (h.acked_at_us == 0) {
      if (low >= h.version) {
        h.acked_at_us = now;
      } else if (now >= h.ack_deadline_us) {
        h.acked_at_us = now;
        out.timed_out.push_back(h.command.task_id);
      }
    }
    if (h.acked_at_us != 0 && now >= h.acked_at_us + h.drain_us)
      out.commands.push_back(std::move(h.command));
    else
      keep.push_back(std::move(h));
  }
  held_ = std::move(keep);
  return out;
}

uint64_t ServiceTable::next_deadline_us() const {
  uint64_t next = 0;
  for (const auto& h : held_) {
    uint64_t at = h.acked_at_us ? h.acked_at_us + h.drain_us : h.ack_deadline_us;
    if (next == 0 || at < next) next = at;
  }
  return next;
}

Service endpoints_of(const std::string& entitlement, const std::vector<TaskRecord>& tasks,
                     const std::function<std::string(MachineId)>& machine_name,
                     const std::function<std::string(MachineId)>& address) {
  std::vector<const TaskRecord*> refs;
  refs.reserve(tasks.size());
  for (const auto& t : tasks) refs.push_back(&t);
  return endpoints_of(entitlement, refs, machine_name, address);
}

Service endpoints_of(const std::string& entitlement, const std::vector<const TaskRecord*>& tasks,
                     const std::function<std::string(MachineId)>& machine_name,
                     const std::function<std::string(MachineId)>& address) {
  Service s;
  s.entitlement = entitlement;
  for (const TaskRecord* tp : tasks) {  // (index, id) order
    const TaskRecord& t = *tp;
    bool published = (t.state == TaskState::kRunning || t.state == TaskState::kDraining) && t.ready;
    if (!published) continue;
    std::string addr = address(t.machine);
    if (addr.empty()) continue;
    s.endpoints.push_back(
        Endpoint{t.id, t.index, t.generation, machine_name(t.machine), addr, t.ports});
  }
  return s;
}

}  // namespace weft::cp
