// The lending policy on plain structs: which free machines a broker lends (spread over
// fault domains, none in the domains to avoid), which a shard gives back (crowded
// domains first), and what its quotas lack by datacenter.
#include "controlplane/region/lending_policy.h"

#include <gtest/gtest.h>

namespace weft::cp {
namespace {

MachineInfo info(const std::string& id, const std::string& dc, const std::string& rack) {
  return MachineInfo{id, dc, rack, "a", {4000, 8192}};
}

struct Fleet {
  Allocator alloc;
  Broker broker{alloc, BrokerConfig{}};
  MachineId add(const std::string& id, const std::string& dc, const std::string& rack) {
    MachineId m = *broker.register_machine(info(id, dc, rack), 0);
    EXPECT_TRUE(broker.health(id, "ok", 0).ok());
    return m;
  }
};

TEST(LendingPolicy, LendsOneMachineADomainInTurnAndAvoidsWhatTheShardAsked) {
  Fleet f;
  for (auto id : {"a1", "a2", "a3"}) f.add(id, "dc1", "ra");
  for (auto id : {"b1", "b2"}) f.add(id, "dc1", "rb");
  f.add("c1", "dc1", "rc");
  EXPECT_EQ(lendable_machines(f.alloc, f.broker, 4, {}),
            (std::vector<std::string>{"a1", "b1", "c1", "a2"}));
  EXPECT_EQ(lendable_machines(f.alloc, f.broker, 10, {"ra", "rc"}),
            (std::vector<std::string>{"b1", "b2"}));
  EXPECT_TRUE(lendable_machines(f.alloc, f.broker, 0, {}).empty());
}

TEST(LendingPolicy, OnlyFreeEmptyMachinesInServiceAreLentOrGivenBack) {
  Fleet f;
  MachineId a = f.add("a", "dc1", "r1");
  f.add("b", "dc1", "r1");
  f.add("c", "dc1", "r1");
  ASSERT_TRUE(f.broker.register_machine(info("d", "dc1", "r1"), 0).ok());  // no verdict yet
  auto e = f.broker.entitlements().create({"web", 1, "", ""});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(f.alloc.assign(a, *e).ok());                       // in an entitlement
  ASSERT_TRUE(f.broker.remove("c", 0, "lent to a shard").ok());  // gone, alive
  EXPECT_EQ(free_empty_machines(f.alloc, f.broker), std::vector<MachineId>{1});
  EXPECT_FALSE(machine_present(f.broker, "c"));  // removed
  EXPECT_FALSE(machine_present(f.broker, "d"));  // not in service
  EXPECT_FALSE(machine_present(f.broker, "nobody"));
  EXPECT_TRUE(machine_present(f.broker, "b"));
}

TEST(LendingPolicy, CrowdedDomainsGoBackFirst) {
  Fleet f;
  f.add("a1", "dc1", "ra");
  f.add("b1", "dc1", "rb");
  f.add("a2", "dc1", "ra");
  EXPECT_EQ(spare_machines(f.alloc, f.broker, {"ra"}),
            (std::vector<std::string>{"a1", "a2", "b1"}));
  EXPECT_EQ(spare_machines(f.alloc, f.broker, {}), (std::vector<std::string>{"a1", "b1", "a2"}));
}

TEST(LendingPolicy, AShortfallIsMetByItsOwnDatacentreFirstThenAnyAndTheRestIsSpare) {
  Fleet f;
  f.add("x1", "dc1", "r1");
  f.add("x2", "dc1", "r1");
  f.add("y1", "dc2", "r2");
  ASSERT_TRUE(f.broker.entitlements().create({"pinned", 3, "", "dc1"}).ok());
  ASSERT_TRUE(f.broker.entitlements().create({"anywhere", 1, "", ""}).ok());
  // dc1 wants 3 and has 2 free: 1 short; "any" wants 1 and takes dc2's free machine.
  auto need = quota_shortfall(f.alloc, f.broker);
  EXPECT_EQ(need["dc1"], 1);
  EXPECT_EQ(need[""], 0);
  // Quotas met: every free machine is to spare (a negative need).
  Fleet g;
  g.add("z1", "dc1", "r1");
  g.add("z2", "dc1", "r1");
  EXPECT_EQ(quota_shortfall(g.alloc, g.broker)[""], -2);
}

}  // namespace
}  // namespace weft::cp
