// The allocator on plain structs: spreading (over domains and machines, the free ones
// included), packing, quotas,
// constraints, all-or-nothing, the job cache, release and shrink.
#include "controlplane/scheduling/allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace weft::cp {
namespace {

// `domains` fault domains with `per_domain` machines each (4 cores, 8 GiB), in the free
// pool; type "a" except where a test changes it.
Allocator fleet(int domains, int per_domain, std::vector<MachineId>* ids = nullptr) {
  Allocator a;
  for (int d = 0; d < domains; ++d)
    for (int i = 0; i < per_domain; ++i) {
      MachineId id = a.add_machine({"m" + std::to_string(d) + "-" + std::to_string(i),
                                    d % 2 ? "dc2" : "dc1",
                                    "msb" + std::to_string(d),
                                    "a",
                                    {4000, 8192}});
      if (ids) ids->push_back(id);
    }
  return a;
}

Request job(const std::string& name, int tasks, int64_t cpu = 1000, int64_t mem = 1024) {
  Request r;
  r.job = name;
  r.entitlement = 1;
  r.tasks = tasks;
  r.per_task = {cpu, mem};
  return r;
}

std::set<std::string> domains_of(const Allocator& a, const std::vector<MachineId>& ms) {
  std::set<std::string> d;
  for (MachineId m : ms) d.insert(a.spec(m).domain);
  return d;
}

TEST(Allocator, SpreadsAcrossFaultDomains) {
  std::vector<MachineId> ids;
  Allocator a = fleet(6, 3, &ids);
  for (MachineId m : ids) ASSERT_TRUE(a.assign(m, 1).ok());
  auto p = a.allocate(job("web", 6));
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_EQ(domains_of(a, p->machines).size(), 6u);  // one task in every domain
  // 12 tasks over 6 domains: two in each, never three in one while another has one.
  auto q = a.allocate(job("api", 12));
  ASSERT_TRUE(q.ok());
  std::map<std::string, int> per;
  for (MachineId m : q->machines) per[a.spec(m).domain]++;
  for (const auto& [d, n] : per) EXPECT_EQ(n, 2) << d;
}

TEST(Allocator, PackedJobsStackInTheEntitlementBeforeTakingFreeMachines) {
  std::vector<MachineId> ids;
  Allocator a = fleet(4, 2, &ids);
  ASSERT_TRUE(a.assign(ids[0], 1).ok());  // the entitlement owns one 4-core machine
  Request w = job("w", 3);                // 3 x 1 core: fits on it
  w.spread = false;
  auto p = a.allocate(w);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->joined.empty());
  for (MachineId m : p->machines) EXPECT_EQ(m, ids[0]);
  EXPECT_EQ(a.free(ids[0]).cpu_milli, 1000);
  // Two more tasks: one still fits there, the other brings a free machine in.
  Request x = job("x", 2);
  x.spread = false;
  auto q = a.allocate(x);
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(q->joined.size(), 1u);
  EXPECT_EQ(a.entitlement_of(q->joined[0]), 1u);
  EXPECT_EQ(a.pool(1).machines, 2u);
  EXPECT_EQ(a.pool(kFreePool).machines, 6u);
}

// The entitlement starts small, as it does in a real fleet: a spread job does not stack
// on its one machine while free machines wait in other domains (it did until issue 12).
TEST(Allocator, SpreadsBeforeStackingWhenTheEntitlementIsSmall) {
  std::vector<MachineId> ids;
  Allocator a = fleet(4, 2, &ids);
  ASSERT_TRUE(a.assign(ids[0], 1).ok());
  auto p = a.allocate(job("w", 3));
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_EQ(domains_of(a, p->machines).size(), 3u);
  EXPECT_EQ(std::set<MachineId>(p->machines.begin(), p->machines.end()).size(), 3u);
  EXPECT_EQ(p->machines[0], ids[0]) << "the entitlement's own machine is used first";
  EXPECT_EQ(p->joined.size(), 2u);
  // One domain, three machines: one task per machine before two on any.
  Allocator b = fleet(1, 3, &ids);
  auto q = b.allocate(job("w", 3));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(std::set<MachineId>(q->machines.begin(), q->machines.end()).size(), 3u);
  // More tasks than machines: evenly, two each.
  auto r = b.allocate(job("x", 6, 100, 10));
  ASSERT_TRUE(r.ok());
  std::map<MachineId, int> per;
  for (MachineId m : r->machines) per[m]++;
  for (const auto& [m, n] : per) EXPECT_EQ(n, 2);
}

TEST(Allocator, AReplacementDoesNotLandBesideItsSiblings) {
  std::vector<MachineId> ids;
  Allocator a = fleet(1, 4, &ids);  // one domain: only machines tell siblings apart
  ASSERT_TRUE(a.assign(ids[0], 1).ok());
  auto p = a.allocate(job("w", 3));
  ASSERT_TRUE(p.ok());
  MachineId failed = p->machines[2];
  a.set_usable(failed, false, true);
  auto q = a.move_tasks("w", {2});
  ASSERT_TRUE(q.ok()) << q.error().str();
  EXPECT_NE(q->machines[2], q->machines[0]);
  EXPECT_NE(q->machines[2], q->machines[1]);
  EXPECT_NE(q->machines[2], failed);
}

// A dead machine gives its quota slot to its replacement: with the quota fully used,
// its tasks can still move (before issue 12: "0 of 1 tasks could be moved").
TEST(Allocator, ADeadMachineDoesNotHoldItsQuotaSlot) {
  std::vector<MachineId> ids;
  Allocator a = fleet(3, 1, &ids);
  a.set_quota(1, 2);
  auto p = a.allocate(job("w", 2, 4000));  // two whole machines: the quota
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_EQ(a.pool(1).quota_members, 2u);
  MachineId dead = p->machines[0];
  a.set_usable(dead, /*healthy=*/false, true);
  EXPECT_EQ(a.pool(1).quota_members, 1u);
  auto q = a.move_tasks("w", {0});
  ASSERT_TRUE(q.ok()) << q.error().str();
  EXPECT_NE(q->machines[0], dead);
  EXPECT_EQ(a.pool(1).quota_members, 2u);
  // Healthy again and empty: the entitlement has one machine over its quota, and
  // shrink gives it back.
  a.set_usable(dead, true, true);
  EXPECT_EQ(a.shrink(1), std::vector<MachineId>{dead});
  EXPECT_EQ(a.pool(1).quota_members, 2u);
}

TEST(Allocator, HardConstraintsFilter) {
  Allocator a;
  MachineId small = a.add_machine({"s", "dc1", "r1", "small", {1000, 1024}});
  MachineId big = a.add_machine({"b", "dc1", "r2", "big", {8000, 16384}});
  MachineId other_dc = a.add_machine({"o", "dc2", "r3", "big", {8000, 16384}});
  MachineId sick = a.add_machine({"k", "dc1", "r4", "big", {8000, 16384}});
  a.set_usable(sick, /*healthy=*/false, true);
  MachineId unready = a.add_machine({"u", "dc1", "r5", "big", {8000, 16384}});
  a.set_usable(unready, true, /*profile_ready=*/false);
  Request r = job("j", 2, 2000, 2048);
  r.dc = "dc1";
  auto p = a.allocate(r);
  ASSERT_TRUE(p.ok()) << p.error().str();
  for (MachineId m : p->machines) EXPECT_EQ(m, big);  // small is too small, o is in dc2
  (void)small;
  (void)other_dc;
  Request t = job("t", 1);
  t.machine_type = "gpu";  // no machine has it
  EXPECT_FALSE(a.allocate(t).ok());
}

TEST(Allocator, AllOrNothing) {
  std::vector<MachineId> ids;
  Allocator a = fleet(2, 1, &ids);  // 8 cores in all
  auto p = a.allocate(job("huge", 9));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().str().find("8 of 9"), std::string::npos) << p.error().str();
  for (MachineId m : ids) {
    EXPECT_EQ(a.free(m).cpu_milli, 4000);
    EXPECT_EQ(a.entitlement_of(m), kFreePool);
  }
  EXPECT_TRUE(a.allocate(job("fits", 8)).ok());
  EXPECT_FALSE(a.allocate(job("one-more", 1)).ok());
}

TEST(Allocator, JobCacheAndNewGenerations) {
  Allocator a = fleet(4, 2);
  auto p = a.allocate(job("w", 4));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->cached);
  auto again = a.allocate(job("w", 4));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->cached);
  EXPECT_EQ(again->machines, p->machines);
  // A new generation (bigger tasks) replaces the old placement once it fits.
  Request r = job("w", 4, 2000);
  r.generation = 2;
  auto next = a.allocate(r);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->cached);
  int64_t used = 0;
  for (MachineId m = 0; m < a.machine_count(); ++m) used += 4000 - a.free(m).cpu_milli;
  EXPECT_EQ(used, 8000);  // only the new generation is held
  // A generation that does not fit leaves the old one in place.
  Request too_big = job("w", 4, 5000);
  too_big.generation = 3;
  EXPECT_FALSE(a.allocate(too_big).ok());
  used = 0;
  for (MachineId m = 0; m < a.machine_count(); ++m) used += 4000 - a.free(m).cpu_milli;
  EXPECT_EQ(used, 8000);
}

TEST(Allocator, ReleaseShrinkAndAssign) {
  Allocator a = fleet(3, 1);
  auto p = a.allocate(job("w", 3, 4000));  // one machine each, all joined
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->joined.size(), 3u);
  EXPECT_EQ(a.pool(1).machines, 3u);
  EXPECT_FALSE(a.assign(p->machines[0], kFreePool).ok());  // still runs a task
  EXPECT_EQ(a.shrink(1).size(), 0u);
  auto empty = a.release("w");
  EXPECT_EQ(empty.size(), 3u);
  EXPECT_EQ(a.shrink(1).size(), 3u);  // the entitlement gives its empty machines back
  EXPECT_EQ(a.pool(1).machines, 0u);
  EXPECT_EQ(a.pool(kFreePool).machines, 3u);
  EXPECT_TRUE(a.release("w").empty());  // releasing twice is harmless
}

TEST(Allocator, MovesTasksOffAFailedMachineKeepingTheSpread) {
  std::vector<MachineId> ids;
  Allocator a = fleet(5, 2, &ids);
  for (MachineId m : ids) ASSERT_TRUE(a.assign(m, 1).ok());
  auto p = a.allocate(job("w", 4));
  ASSERT_TRUE(p.ok());
  MachineId failed = p->machines[1];
  std::string failed_domain = a.spec(failed).domain;
  a.set_usable(failed, /*healthy=*/false, true);
  auto q = a.move_tasks("w", {1});
  ASSERT_TRUE(q.ok()) << q.error().str();
  EXPECT_NE(q->machines[1], failed);
  for (int i : {0, 2, 3})
    EXPECT_EQ(q->machines[static_cast<size_t>(i)], p->machines[static_cast<size_t>(i)]);
  // The replacement goes to the one domain the job did not use (its 5th), not next to
  // a task that stayed.
  std::set<std::string> d = domains_of(a, q->machines);
  EXPECT_EQ(d.size(), 4u);
  EXPECT_EQ(a.free(failed).cpu_milli, 4000);
  EXPECT_EQ(a.tasks_on(failed), 0);
  // Nowhere to go (every machine drained): nothing changes.
  for (MachineId m : ids) a.set_usable(m, false, true);
  auto r = a.move_tasks("w", {0});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(a.tasks_on(q->machines[0]), 1);
  EXPECT_FALSE(a.move_tasks("w", {7}).ok());
  EXPECT_FALSE(a.move_tasks("nope", {0}).ok());
}

// The ReBalancer's targeted move: to a machine of the job's entitlement with room and
// the ports; anything else refused with nothing changed.
TEST(Allocator, MovesATaskToAChosenMachineOrNothing) {
  std::vector<MachineId> ids;
  Allocator a = fleet(2, 3, &ids);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(a.assign(ids[i], 1).ok());  // ids[4..5] free
  Request r = job("web", 2, 3000, 1024);
  r.fixed_ports = {8080};
  auto p = a.allocate(r);
  ASSERT_TRUE(p.ok()) << p.error().str();
  const MachineId from = p->machines[0];
  MachineId to = 0;
  for (size_t i = 0; i < 4; ++i)
    if (ids[i] != p->machines[0] && ids[i] != p->machines[1]) to = ids[i];
  const auto before_from = a.free(from), before_to = a.free(to);
  // Refused: the machine it is on, another's, out of range, a free-pool machine.
  EXPECT_FALSE(a.move_task_to("web", 0, from).ok());
  EXPECT_FALSE(a.move_task_to("web", 0, p->machines[1]).ok());  // port 8080 is held there
  EXPECT_FALSE(a.move_task_to("web", 5, to).ok());
  EXPECT_FALSE(a.move_task_to("nope", 0, to).ok());
  EXPECT_FALSE(a.move_task_to("web", 0, 99).ok());
  auto other = a.move_task_to("web", 0, ids[4]);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().str().find("not a machine of the job's entitlement"), std::string::npos);
  // Refused: unusable, and without room.
  a.set_usable(to, false, true);
  EXPECT_FALSE(a.move_task_to("web", 0, to).ok());
  a.set_usable(to, true, true);
  EXPECT_EQ(a.free(from), before_from);
  EXPECT_EQ(a.free(to), before_to);
  // Moved: the slot and its port follow the task.
  ASSERT_TRUE(a.move_task_to("web", 0, to).ok());
  EXPECT_EQ(a.placement("web")[0], to);
  EXPECT_EQ(a.free(from).cpu_milli, before_from.cpu_milli + 3000);
  EXPECT_EQ(a.free(to).cpu_milli, before_to.cpu_milli - 3000);
  EXPECT_TRUE(a.port_held(to, 8080));
  EXPECT_FALSE(a.port_held(from, 8080));
  auto changed = a.take_changed_jobs();
  EXPECT_TRUE(changed.count("web"));
  // No room left on `to` for another 3-core task.
  EXPECT_FALSE(a.move_task_to("web", 1, to).ok());
}

TEST(Allocator, QuotaCapsFreeMachinesTaken) {
  Allocator a = fleet(4, 1);
  a.set_quota(1, 2);
  auto p = a.allocate(job("w", 4, 4000));  // needs 4 whole machines, quota is 2
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(a.pool(1).machines, 0u);
  EXPECT_TRUE(a.allocate(job("w", 2, 4000)).ok());
  EXPECT_EQ(a.pool(1).machines, 2u);
  EXPECT_FALSE(a.allocate(job("x", 1, 1000)).ok());  // full machines, no more quota
  a.set_quota(1, 3);
  EXPECT_TRUE(a.allocate(job("x", 1, 1000)).ok());
}

TEST(Allocator, BadRequests) {
  Allocator a = fleet(1, 1);
  Request r = job("", 1);
  EXPECT_EQ(a.allocate(r).error().field, "job");
  r = job("j", 0);
  EXPECT_EQ(a.allocate(r).error().field, "tasks");
  r = job("j", 1, -1);
  EXPECT_EQ(a.allocate(r).error().field, "resources");
  r = job("j", 1);
  r.entitlement = kFreePool;
  EXPECT_EQ(a.allocate(r).error().field, "entitlement");
}

}  // namespace
}  // namespace weft::cp
