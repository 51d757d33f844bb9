// Ports as a placement resource (allocator and scheduler), and the service table: its
// versions, the updates agents get, and the stops it holds until every agent that
// answers DNS acknowledged the withdrawal.
#include "controlplane/discovery/service_table.h"

#include <gtest/gtest.h>

#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {
namespace {

Allocator machines(int n, std::vector<MachineId>* ids, uint16_t first = 20000,
                   uint16_t last = 20009) {
  Allocator a;
  for (int i = 0; i < n; ++i) {
    MachineSpec s{"m" + std::to_string(i), "dc1", "rack" + std::to_string(i), "a", {16000, 65536}};
    s.port_first = first;
    s.port_last = last;
    ids->push_back(a.add_machine(s));
  }
  return a;
}

Request req(const std::string& job, int tasks, std::vector<uint16_t> fixed, int dynamic,
            bool spread = true) {
  Request r;
  r.job = job;
  r.entitlement = 1;
  r.tasks = tasks;
  r.per_task = {100, 64};
  r.fixed_ports = std::move(fixed);
  r.dynamic_ports = dynamic;
  r.spread = spread;
  return r;
}

TEST(Ports, TwoClaimsOfOneFixedPortNeverShareAMachine) {
  std::vector<MachineId> ids;
  Allocator a = machines(3, &ids);
  // Packed, a job would stack on one machine: its fixed port allows one task there.
  auto p = a.allocate(req("web", 3, {9100}, 0, /*spread=*/false));
  ASSERT_TRUE(p.ok()) << p.error().str();
  std::set<MachineId> used(p->machines.begin(), p->machines.end());
  EXPECT_EQ(used.size(), 3u);
  // Another job claiming 9100 finds every machine taken.
  EXPECT_FALSE(a.allocate(req("metrics", 1, {9100}, 0)).ok());
  EXPECT_TRUE(a.allocate(req("other", 3, {9200}, 0)).ok());
  // Released, the port is free again.
  a.release("web");
  EXPECT_TRUE(a.allocate(req("metrics", 1, {9100}, 0)).ok());
  for (MachineId m : ids) EXPECT_EQ(a.port_held(m, 9100), m == a.placement("metrics")[0]);
}

TEST(Ports, DynamicPortsAreUniquePerMachineAndRunOut) {
  std::vector<MachineId> ids;
  Allocator a = machines(1, &ids, 20000, 20005);  // 6 ports
  ASSERT_TRUE(a.allocate(req("a", 2, {}, 2, false)).ok());
  auto ports = a.dynamic_ports("a");
  ASSERT_EQ(ports.size(), 2u);
  std::set<uint16_t> all;
  for (const auto& v : ports) {
    ASSERT_EQ(v.size(), 2u);
    for (uint16_t p : v) {
      EXPECT_GE(p, 20000);
      EXPECT_LE(p, 20005);
      all.insert(p);
    }
  }
  EXPECT_EQ(all.size(), 4u);
  // Two left: one task of two more does not fit; one of two does.
  EXPECT_FALSE(a.allocate(req("b", 2, {}, 2, false)).ok());
  ASSERT_TRUE(a.allocate(req("b", 1, {}, 2, false)).ok());
  for (uint16_t p : a.dynamic_ports("b", 0)) EXPECT_FALSE(all.count(p));
  // A fixed port inside the range is a claim like any other.
  EXPECT_FALSE(a.allocate(req("c", 1, {20001}, 0)).ok());
}

TEST(Ports, APortLetGoIsTheLastToBeHandedOutAgain) {
  std::vector<MachineId> ids;
  Allocator a = machines(1, &ids, 20000, 20009);
  ASSERT_TRUE(a.allocate(req("a", 1, {}, 1)).ok());
  uint16_t first = a.dynamic_ports("a", 0).at(0);
  a.release("a");
  ASSERT_TRUE(a.allocate(req("b", 1, {}, 1)).ok());
  EXPECT_NE(a.dynamic_ports("b", 0).at(0), first);
}

TEST(Ports, ARestoredPlacementKeepsItsPorts) {
  std::vector<MachineId> ids;
  Allocator a = machines(2, &ids);
  ASSERT_TRUE(a.allocate(req("web", 2, {9100}, 2)).ok());
  auto placement = a.placement("web");
  auto dynamic = a.dynamic_ports("web");
  Allocator b;
  for (MachineId m : ids) (void)b.add_machine(a.spec(m));
  ASSERT_TRUE(b.restore(*a.request("web"), placement, dynamic).ok());
  EXPECT_EQ(b.dynamic_ports("web"), dynamic);
  for (size_t i = 0; i < placement.size(); ++i) {
    EXPECT_TRUE(b.port_held(placement[i], 9100));
    for (uint16_t p : dynamic[i]) EXPECT_TRUE(b.port_held(placement[i], p));
  }
  // Off its machine, a task has nowhere to go (the other holds 9100): nothing changes.
  b.set_usable(placement[0], false, true);
  EXPECT_FALSE(b.move_tasks("web", {0}).ok());
  EXPECT_TRUE(b.port_held(placement[0], 9100));
  EXPECT_EQ(b.dynamic_ports("web"), dynamic);
  // With a third machine it moves there, with ports of that machine, and lets go of the
  // old ones.
  MachineSpec third = a.spec(ids[0]);
  third.name = "m2";
  third.domain = "rack2";
  MachineId m2 = b.add_machine(third);
  ASSERT_TRUE(b.move_tasks("web", {0}).ok());
  EXPECT_EQ(b.placement("web")[0], m2);
  EXPECT_TRUE(b.port_held(m2, 9100));
  EXPECT_FALSE(b.port_held(placement[0], 9100));
  for (uint16_t p : dynamic[0]) EXPECT_FALSE(b.port_held(placement[0], p));
}

TEST(Ports, TheSchedulerStartsEachTaskWithItsPorts) {
  std::vector<MachineId> ids;
  Allocator a = machines(3, &ids);
  for (MachineId m : ids) ASSERT_TRUE(a.assign(m, 1).ok());
  Scheduler s(a);
  JobSpec j;
  j.name = "web";
  j.count = 3;
  j.per_task = {100, 64};
  j.ports = {{"http", 0}, {"admin", 9100}};
  j.task = {{"argv", {"/bin/sleep", "infinity"}}};
  auto cmds = s.create(j, 1);
  ASSERT_TRUE(cmds.ok()) << cmds.error().str();
  ASSERT_EQ(cmds->size(), 3u);
  std::set<MachineId> where;
  for (const auto& c : *cmds) {
    where.insert(c.machine);
    ASSERT_TRUE(c.run_params().contains("ports")) << c.run_text();
    EXPECT_EQ(c.run_params()["ports"]["admin"], 9100);
    uint16_t http = c.run_params()["ports"]["http"].get<uint16_t>();
    EXPECT_GE(http, 20000);
    EXPECT_LE(http, 20009);
    const TaskRecord& t = s.tasks().at(c.task_id);
    EXPECT_EQ(t.ports.at("http"), http);
  }
  EXPECT_EQ(where.size(), 3u);
  // An update that changes the ports is refused (they are placement).
  JobSpec changed = j;
  changed.ports["admin"] = 9200;
  EXPECT_FALSE(s.rollouts().update(changed, 2).ok());
}

Service svc(std::initializer_list<std::string> tasks) {
  Service s{"ent", {}};
  int i = 0;
  for (const auto& t : tasks) s.endpoints.push_back(Endpoint{t, i++, 1, "m", "10.0.0.1", {}});
  return s;
}

Command stop(const std::string& task) {
  return Command{Command::Kind::kStop, 0, task, {}};
}

TEST(ServiceTable, ChangesMakeVersionsAndUpdatesCarryThem) {
  ServiceTable t;
  t.start_at(100);
  EXPECT_TRUE(t.set("web", svc({"web.0.1", "web.1.2"})).empty());
  EXPECT_EQ(t.version(), 101u);
  EXPECT_TRUE(t.set("web", svc({"web.0.1", "web.1.2"})).empty());
  EXPECT_EQ(t.version(), 101u);  // the same set: no new version
  auto left = t.set("web", svc({"web.0.1"}));
  EXPECT_EQ(left, std::vector<std::string>{"web.1.2"});
  t.set("db", svc({"db.0.1"}));
  EXPECT_EQ(t.erase("db"), std::vector<std::string>{"db.0.1"});
  ServiceUpdate u = t.update_since(101);
  EXPECT_FALSE(u.reset);
  EXPECT_EQ(u.version, t.version());
  ASSERT_EQ(u.services.size(), 2u);
  EXPECT_EQ(u.services.at("web")->endpoints.size(), 1u);
  EXPECT_FALSE(u.services.at("db").has_value());  // gone
  auto chunks = t.snapshot(1);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_TRUE(chunks[0].reset);
  // Applied in order, an agent's copy is the table.
  ServiceCatalog agent;
  for (const auto& c : t.snapshot(1)) agent.apply(c);
  EXPECT_EQ(agent.services(), t.services());
}

TEST(ServiceTable, AStopWaitsForEveryAgentThenTheDrain) {
  ServiceTable t;
  t.set("web", svc({"web.0.1", "web.1.2"}));
  t.subscribe(1);
  t.subscribe(2);
  t.ack(1, t.version());
  t.ack(2, t.version());
  auto left = t.set("web", svc({"web.0.1"}));
  ASSERT_EQ(left.size(), 1u);
  t.hold_stop(stop("web.1.2"), "web", t.version(), 1000, 5'000'000, 2'000'000);
  t.hold_stop(stop("web.1.2"), "web", t.version(), 1000, 5'000'000, 2'000'000);  // once
  EXPECT_EQ(t.held(), 1u);
  EXPECT_TRUE(t.release(2000).commands.empty());
  t.ack(1, t.version());
  EXPECT_TRUE(t.release(3000).commands.empty());  // machine 2 has the old set still
  t.ack(2, t.version());
  EXPECT_TRUE(t.release(4000).commands.empty());  // every agent has it: now the drain
  EXPECT_EQ(t.next_deadline_us(), 4000u + 2'000'000);
  auto r = t.release(4000 + 2'000'000);
  ASSERT_EQ(r.commands.size(), 1u);
  EXPECT_EQ(r.commands[0].task_id, "web.1.2");
  EXPECT_TRUE(r.timed_out.empty());
  EXPECT_EQ(t.held(), 0u);
}

TEST(ServiceTable, AnAgentThatNeverAnswersHoldsAStopOnlyUntilTheTimeout) {
  ServiceTable t;
  t.set("web", svc({"web.0.1"}));
  t.subscribe(1);
  t.set("web", svc({}));
  t.hold_stop(stop("web.0.1"), "web", t.version(), 0, 5'000'000, 0);
  EXPECT_TRUE(t.release(4'999'999).commands.empty());
  auto r = t.release(5'000'000);
  ASSERT_EQ(r.commands.size(), 1u);
  EXPECT_EQ(r.timed_out, std::vector<std::string>{"web.0.1"});
  // An agent that went away does not hold anything back.
  t.set("web", svc({"web.0.2"}));
  t.set("web", svc({}));
  t.hold_stop(stop("web.0.2"), "web", t.version(), 6'000'000, 5'000'000, 0);
  t.unsubscribe(1);
  EXPECT_EQ(t.release(6'000'001).commands.size(), 1u);
}

// Issue 46: an agent that asked for some jobs is sent those, and holds back only their
// stops; one subscribed to everything is sent and holds back every job's.
TEST(ServiceTable, AnAgentThatAskedForJobsGetsAndHoldsBackOnlyThose) {
  ServiceTable t;
  t.subscribe(1);  // every job
  t.subscribe(2, /*everything=*/false);
  EXPECT_EQ(t.interest(2, "WEB"), ServiceTable::Interest::kAdded);  // case-insensitive
  EXPECT_EQ(t.interest(2, "web"), ServiceTable::Interest::kHad);
  EXPECT_EQ(t.interest(1, "db"), ServiceTable::Interest::kHad);
  EXPECT_TRUE(t.wants(2, "Web"));
  EXPECT_FALSE(t.wants(2, "db"));
  EXPECT_TRUE(t.wants(1, "db"));
  uint64_t from = t.version();
  t.set("web", svc({"web.0.1", "web.1.2"}));
  t.set("db", svc({"db.0.3"}));
  ServiceUpdate u = t.update_since(from);
  auto wanted = t.wanted(u);
  ASSERT_EQ(wanted.size(), 1u);  // agent 1 takes all of it; agent 2 only web
  EXPECT_EQ(wanted[2], std::vector<std::string>{"web"});
  ServiceUpdate part = t.part_for(2, u);
  ASSERT_EQ(part.services.size(), 1u);
  EXPECT_TRUE(part.services.count("web"));
  EXPECT_EQ(t.part_for(1, u).services.size(), 2u);
  EXPECT_EQ(t.any_case("WEB"), std::vector<std::string>{"web"});
  // db's stop: agent 2 does not answer for db and never acknowledges; agent 1 does.
  t.sent(1, t.version());
  t.sent(2, t.version());
  t.set("db", svc({}));
  t.hold_stop(stop("db.0.3"), "db", t.version(), 0, 5'000'000, 0);
  EXPECT_TRUE(t.release(1).commands.empty());
  t.ack(1, t.version());
  auto r = t.release(2);
  ASSERT_EQ(r.commands.size(), 1u);
  EXPECT_TRUE(r.timed_out.empty());
  // web's stop waits for agent 2 as well.
  t.set("web", svc({"web.0.1"}));
  t.hold_stop(stop("web.1.2"), "web", t.version(), 10, 5'000'000, 0);
  t.ack(1, t.version());
  EXPECT_TRUE(t.release(20).commands.empty());
  EXPECT_LT(t.acked(2), t.sent_to(2));
  t.ack(2, t.version());
  EXPECT_EQ(t.release(30).commands.size(), 1u);
  // An agent that forgets web (its clients stopped asking) is sent nothing of it, and a
  // stop of web's held for its acknowledgement goes without it.
  t.set("web", svc({}));
  t.hold_stop(stop("web.0.1"), "web", t.version(), 40, 5'000'000, 0);
  t.ack(1, t.version());
  EXPECT_TRUE(t.release(50).commands.empty());
  EXPECT_FALSE(t.forget(1, "web"));  // told of every job: nothing to forget
  EXPECT_TRUE(t.forget(2, "WEB"));
  EXPECT_FALSE(t.forget(2, "web"));
  EXPECT_FALSE(t.wants(2, "web"));
  EXPECT_EQ(t.release(60).commands.size(), 1u);
  EXPECT_TRUE(t.wanted(t.update_since(from)).empty());
  EXPECT_TRUE(t.part_for(2, t.update_since(from)).services.empty());
  EXPECT_EQ(t.interests(2), 0u);
  // At most kMaxInterests jobs an agent; a new session starts from none.
  for (size_t i = t.interests(2); i < ServiceTable::kMaxInterests; ++i)
    EXPECT_EQ(t.interest(2, "j" + std::to_string(i)), ServiceTable::Interest::kAdded);
  EXPECT_EQ(t.interest(2, "one-more"), ServiceTable::Interest::kFull);
  t.subscribe(2, false);
  EXPECT_EQ(t.interests(2), 0u);
  EXPECT_TRUE(t.wanted(u).empty());
}

TEST(ServiceTable, EndpointsAreTheReadyTasksOnMachinesWithAnAddress) {
  std::vector<TaskRecord> tasks(4);
  tasks[0] = TaskRecord{"web.0.1", "web", 0, 1, 7, TaskState::kRunning, 0, "", false, 0, "", true};
  tasks[1] = TaskRecord{"web.1.2", "web", 1, 1, 7, TaskState::kRunning, 0, "", false, 0, "", false};
  tasks[2] = TaskRecord{"web.2.3", "web", 2, 1, 8, TaskState::kDraining, 0, "", false, 0, "", true};
  tasks[3] = TaskRecord{"web.3.4", "web", 3, 1, 9, TaskState::kRunning, 0, "", false, 0, "", true};
  tasks[0].ports = {{"http", 20001}};
  Service s = endpoints_of(
      "ent", tasks, [](MachineId m) { return "m" + std::to_string(m); },
      [](MachineId m) { return m == 9 ? std::string() : "10.0.0." + std::to_string(m); });
  ASSERT_EQ(s.endpoints.size(), 2u);  // not ready; no address known
  EXPECT_EQ(s.endpoints[0].task, "web.0.1");
  EXPECT_EQ(s.endpoints[0].address, "10.0.0.7");
  EXPECT_EQ(s.endpoints[0].ports.at("http"), 20001);
  EXPECT_EQ(s.endpoints[1].task, "web.2.3");  // draining still serves until its stop
}

}  // namespace
}  // namespace weft::cp
