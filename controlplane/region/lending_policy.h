// Which machines a region's broker lends and a shard gives back (docs/regions.md,
// "Machines lent between brokers and shards"): the policy behind Lending's hooks, pure
// functions of the allocator and the broker, so that Lending (lending.h) moves machines
// and this decides which.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "controlplane/machines/broker.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

// Free machines in service that hold nothing: what a broker may lend, what a shard has
// spare.
std::vector<MachineId> free_empty_machines(const Allocator& alloc, const Broker& broker);
// Broker: up to `count` of them, spread over fault domains (one from each in turn, so
// that what a shard borrows is not one rack), none in the domains it asked to avoid.
std::vector<std::string> lendable_machines(const Allocator& alloc, const Broker& broker,
                                           size_t count, const std::set<std::string>& avoid);
// Shard: the free, empty machines it could give back, those in the domains `crowded`
// (where its ReBalancer wants fewer) first: a machine it borrowed for an entitlement's
// spread is kept for it.
std::vector<std::string> spare_machines(const Allocator& alloc, const Broker& broker,
                                        const std::set<std::string>& crowded);
// Shard: what its entitlements' quotas lack, by datacenter ("" = any), less its free
// machines: each serves its own datacenter's need first, then any datacenter's; what is
// left free counts against "" (negative: that many to spare).
std::map<std::string, long> quota_shortfall(const Allocator& alloc, const Broker& broker);
// Shard: whether a machine it borrowed has arrived (registered here, in service).
bool machine_present(const Broker& broker, const std::string& name);

}  // namespace weft::cp
