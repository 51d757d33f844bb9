#include "controlplane/region/lending_policy.h"

#include <algorithm>

namespace weft::cp {

std::vector<MachineId> free_empty_machines(const Allocator& alloc, const Broker& broker) {
  std::vector<MachineId> out;
  for (MachineId m = 0; m < alloc.machine_count(); ++m)
    if (!broker.removed(m) && alloc.entitlement_of(m) == kFreePool && broker.usable(m) &&
        !alloc.pinned(m) && alloc.tasks_on(m) == 0)
      out.push_back(m);
  return out;
}

std::vector<std::string> lendable_machines(const Allocator& alloc, const Broker& broker,
                                           size_t count, const std::set<std::string>& avoid) {
  std::map<std::string, std::vector<MachineId>> by_domain;
  for (MachineId m : free_empty_machines(alloc, broker))
    if (!avoid.count(alloc.spec(m).domain)) by_domain[alloc.spec(m).domain].push_back(m);
  std::vector<std::string> names;
  for (size_t i = 0; names.size() < count; ++i) {
    bool any = false;
    for (const auto& [domain, ms] : by_domain)
      if (i < ms.size() && names.size() < count) {
        names.push_back(alloc.spec(ms[i]).name);
        any = true;
      }
    if (!any) break;
  }
  return names;
}

std::vector<std::string> spare_machines(const Allocator& alloc, const Broker& broker,
                                        const std::set<std::string>& crowded) {
  std::vector<std::string> first, then;
  for (MachineId m : free_empty_machines(alloc, broker))
    (crowded.count(alloc.spec(m).domain) ? first : then).push_back(alloc.spec(m).name);
  first.insert(first.end(), then.begin(), then.end());
  return first;
}

std::map<std::string, long> quota_shortfall(const Allocator& alloc, const Broker& broker) {
  std::map<std::string, long> need;
  for (const auto& [id, e] : broker.entitlements()) {
    size_t have = alloc.pool(id).quota_members;
    if (e.quota > have) need[e.dc] += static_cast<long>(e.quota - have);
  }
  std::map<std::string, long> free;
  for (MachineId m : free_empty_machines(alloc, broker)) ++free[alloc.spec(m).dc];
  for (const char* pass : {"own", "any"})
    for (auto& [dc, n] : free) {
      long& want = need[std::string(pass) == "own" ? dc : ""];
      long use = std::min(n, std::max(0L, want));
      want -= use;
      n -= use;
    }
  for (const auto& [dc, n] : free) need[""] -= n;  // to spare
  return need;
}

bool machine_present(const Broker& broker, const std::string& name) {
  auto m = broker.find(name);  // registered, and in service (counted as free)
  return m && !broker.removed(*m) && broker.usable(*m);
}

}  // namespace weft::cp
