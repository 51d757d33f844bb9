#include "controlplane/discovery/service_table.h"

#include <algorithm>

#include "common/strings.h"

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

std::vector<std::string> ServiceTable::any_case(const std::string& job) const {
  auto it = by_lower_.find(ascii_lower(job));
  if (it == by_lower_.end()) return {};
  return {it->second.begin(), it->second.end()};
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
  if (!old) by_lower_[ascii_lower(job)].insert(job);
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
  if (auto l = by_lower_.find(ascii_lower(job)); l != by_lower_.end()) {
    l->second.erase(job);
    if (l->second.empty()) by_lower_.erase(l);
  }
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

void ServiceTable::subscribe(MachineId m, bool everything) {
  unsubscribe(m);  // a new session starts from nothing
  subs_[m].everything = everything;
}

void ServiceTable::unsubscribe(MachineId m) {
  auto it = subs_.find(m);
  if (it == subs_.end()) return;
  for (const auto& job : it->second.jobs) {
    auto w = wanted_by_.find(job);
    if (w == wanted_by_.end()) continue;
    w->second.erase(m);
    if (w->second.empty()) wanted_by_.erase(w);
  }
  subs_.erase(it);
}

ServiceTable::Interest ServiceTable::interest(MachineId m, const std::string& job) {
  auto it = subs_.find(m);
  if (it == subs_.end()) return Interest::kFull;
  Subscriber& s = it->second;
  if (s.everything) return Interest::kHad;
  std::string key = ascii_lower(job);
  if (s.jobs.count(key)) return Interest::kHad;
  if (s.jobs.size() >= kMaxInterests) return Interest::kFull;
  s.jobs.insert(key);
  wanted_by_[key].insert(m);
  return Interest::kAdded;
}

bool ServiceTable::forget(MachineId m, const std::string& job) {
  auto it = subs_.find(m);
  if (it == subs_.end() || it->second.everything) return false;
  std::string key = ascii_lower(job);
  if (!it->second.jobs.erase(key)) return false;
  if (auto w = wanted_by_.find(key); w != wanted_by_.end()) {
    w->second.erase(m);
    if (w->second.empty()) wanted_by_.erase(w);
  }
  return true;
}

bool ServiceTable::wants(MachineId m, const std::string& job) const {
  auto it = subs_.find(m);
  return it != subs_.end() && (it->second.everything || it->second.jobs.count(ascii_lower(job)));
}

bool ServiceTable::everything(MachineId m) const {
  auto it = subs_.find(m);
  return it != subs_.end() && it->second.everything;
}

size_t ServiceTable::interests(MachineId m) const {
  auto it = subs_.find(m);
  return it == subs_.end() ? 0 : it->second.jobs.size();
}

std::map<MachineId, std::vector<std::string>> ServiceTable::wanted(const ServiceUpdate& u) const {
  std::map<MachineId, std::vector<std::string>> out;
  if (wanted_by_.empty()) return out;
  for (const auto& [job, s] : u.services) {
    auto w = wanted_by_.find(ascii_lower(job));
    if (w == wanted_by_.end()) continue;
    for (MachineId m : w->second) out[m].push_back(job);
  }
  return out;
}

ServiceUpdate ServiceTable::part_for(MachineId m, const ServiceUpdate& u) const {
  auto it = subs_.find(m);
  if (it == subs_.end() || it->second.everything) return u;
  ServiceUpdate part;
  part.version = u.version;
  part.reset = u.reset;
  for (const auto& [job, s] : u.services)
    if (it->second.jobs.count(ascii_lower(job))) part.services.emplace(job, s);
  return part;
}

void ServiceTable::sent(MachineId m, uint64_t version) {
  auto it = subs_.find(m);
  if (it != subs_.end()) it->second.sent = std::max(it->second.sent, version);
}

uint64_t ServiceTable::sent_to(MachineId m) const {
  auto it = subs_.find(m);
  return it == subs_.end() ? 0 : it->second.sent;
}

void ServiceTable::ack(MachineId m, uint64_t version) {
  auto it = subs_.find(m);
  if (it != subs_.end()) it->second.acked = std::max(it->second.acked, std::min(version, version_));
}

uint64_t ServiceTable::acked(MachineId m) const {
  auto it = subs_.find(m);
  return it == subs_.end() ? 0 : it->second.acked;
}

uint64_t ServiceTable::acked_by_all() const {
  uint64_t low = version_;
  for (const auto& [m, s] : subs_)
    if (s.everything) low = std::min(low, s.acked);
  return low;
}

uint64_t ServiceTable::acked_by_all(const std::string& job, uint64_t low) const {
  if (auto w = wanted_by_.find(ascii_lower(job)); w != wanted_by_.end())
    for (MachineId m : w->second) low = std::min(low, subs_.at(m).acked);
  return low;
}

void ServiceTable::hold_stop(Command c, const std::string& job, uint64_t version, uint64_t now,
                             uint64_t ack_timeout_us, uint64_t drain_us) {
  for (const auto& h : held_)
    if (h.command.task_id == c.task_id && h.command.machine == c.machine) return;  // once
  held_.push_back(Held{std::move(c), job, version, now + ack_timeout_us, drain_us, 0});
}

bool ServiceTable::holds(const std::string& task) const {
  return std::any_of(held_.begin(), held_.end(),
                     [&](const Held& h) { return h.command.task_id == task; });
}

ServiceTable::Released ServiceTable::release(uint64_t now) {
  Released out;
  // One walk of the agents told of every job a release, then per job its own agents'.
  const uint64_t everywhere = held_.empty() ? version_ : acked_by_all();
  std::map<std::string, uint64_t> low;
  std::vector<Held> keep;
  for (auto& h : held_) {
    if (h.acked_at_us == 0) {
      auto l = low.find(h.job);
      if (l == low.end()) l = low.emplace(h.job, acked_by_all(h.job, everywhere)).first;
      if (l->second >= h.version) {
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
