// The Resource Broker on plain structs: registration, heartbeats and death, HCS
// verdicts, drains, entitlements with quotas and profiles, and the scheduler holding
// tasks on a machine until its entitlement's profile is applied.
#include "controlplane/machines/broker.h"

#include <gtest/gtest.h>

#include "controlplane/daemon/manager.h"
#include "controlplane/entitlements/profile_rolls.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {
namespace {

constexpr uint64_t kS = 1'000'000;

MachineInfo info(const std::string& id, const std::string& rack) {
  return MachineInfo{id, "dc1", rack, "a", {4000, 8192}};
}

// Machines h0..h{n-1}, a rack each, registered and healthy.
void register_healthy(Broker& b, int n) {
  for (int i = 0; i < n; ++i) {
    std::string id = "h" + std::to_string(i);
    ASSERT_TRUE(b.register_machine(info(id, "r" + std::to_string(i)), 0).ok());
    ASSERT_TRUE(b.health(id, "ok", 0).ok());
  }
}

// A scheduler that places tasks only where the broker says a machine is ready (usable,
// its entitlement's profile applied), as the daemon's is.
void place_when_prepared(Scheduler& s, const Broker& b) {
  s.placer().set_ready_check(
      [&b](MachineId m) { return b.usable(m) && b.state_of(m) != "preparing"; });
}
// Job "site" of `count` tasks in entitlement e.
JobSpec site(EntitlementId e, int count) {
  JobSpec j;
  j.name = "site";
  j.entitlement_id = e;
  j.count = count;
  return j;
}

TEST(Broker, RegisterHeartbeatsAndDeath) {
  Allocator a;
  Broker b(a, BrokerConfig{5 * kS, 3});
  auto m = b.register_machine(info("host1", "r1"), 0);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*b.register_machine(info("host1", "r1"), 1), *m);  // idempotent
  EXPECT_FALSE(b.usable(*m));  // no HCS verdict yet: unknown is not healthy
  ASSERT_TRUE(b.health("host1", "ok", 1).ok());
  EXPECT_TRUE(b.usable(*m));
  EXPECT_EQ(b.take_ready(), std::vector<MachineId>{*m});
  ASSERT_TRUE(b.heartbeat("host1", 10 * kS).ok());
  EXPECT_TRUE(b.check(24 * kS).empty());  // 14 s since the last: within 3 x 5 s
  auto dead = b.check(26 * kS);
  ASSERT_EQ(dead, std::vector<MachineId>{*m});
  EXPECT_EQ(b.state_of(*m), "dead");
  EXPECT_FALSE(b.usable(*m));
  EXPECT_TRUE(b.check(30 * kS).empty());  // reported once
  EXPECT_TRUE(b.take_failed().empty());   // not twice through the other door
  ASSERT_TRUE(b.heartbeat("host1", 31 * kS).ok());
  EXPECT_TRUE(b.usable(*m));
  EXPECT_EQ(b.unavailability().all().back().kind, "back");
  EXPECT_FALSE(b.heartbeat("nobody", 0).ok());
  EXPECT_EQ(b.register_machine(MachineInfo{"x", "", "", "", {0, 1}}, 0).error().field, "capacity");
}

// After a restart every machine was cut off at once: none is dead before the failover
// grace, unless it came back and then fell silent (judged as usual).
TEST(Broker, MachinesHaveTheFailoverGraceAfterARestore) {
  Allocator a;
  Broker b(a, BrokerConfig{1 * kS, 3, 60 * kS});
  MachineId back = *b.register_machine(info("back", "r1"), 100 * kS);  // the restore
  MachineId gone = *b.register_machine(info("gone", "r1"), 100 * kS);
  MachineId late = *b.register_machine(info("late", "r1"), 100 * kS);
  b.begin_failover_grace(100 * kS);
  ASSERT_TRUE(b.heartbeat("back", 101 * kS).ok());
  EXPECT_TRUE(b.check(103 * kS).empty());  // silent 3 s: dead without the grace
  // "back" fell silent after it came back: the usual timeout.
  EXPECT_EQ(b.check(105 * kS), std::vector<MachineId>{back});
  EXPECT_TRUE(b.check(157 * kS).empty());
  ASSERT_TRUE(b.heartbeat("late", 158 * kS).ok());  // after 58 s of backoff
  // The grace is over: the machine never heard from since the restore is dead, once.
  EXPECT_EQ(b.check(160 * kS), std::vector<MachineId>{gone});
  EXPECT_EQ(b.unavailability().all().back().detail, "not back after the control plane's restart");
  EXPECT_NE(b.state_of(late), "dead");
  // "late" is judged by its own heartbeats now.
  EXPECT_TRUE(b.check(161 * kS).empty());
  EXPECT_EQ(b.check(162 * kS), std::vector<MachineId>{late});
  EXPECT_EQ(b.state_of(gone), "dead");
  // A grace shorter than the usual timeout is the usual timeout.
  Allocator a2;
  Broker short_grace(a2, BrokerConfig{10 * kS, 3, 1 * kS});
  MachineId m = *short_grace.register_machine(info("m", "r1"), 0);
  short_grace.begin_failover_grace(0);
  EXPECT_TRUE(short_grace.check(29 * kS).empty());
  EXPECT_EQ(short_grace.check(30 * kS), std::vector<MachineId>{m});
}

// The control plane's own stall (a slow etcd write holding its loop, a paused process)
// is not the machines' silence: what they sent meanwhile is unread, not missing.
TEST(Broker, TheControlPlanesOwnStallIsNotCountedAsMachinesSilence) {
  Allocator a;
  Broker b(a, BrokerConfig{1 * kS, 3});
  MachineId quiet = *b.register_machine(info("quiet", "r1"), 10 * kS);
  MachineId loud = *b.register_machine(info("loud", "r1"), 10 * kS);
  ASSERT_TRUE(b.heartbeat("loud", 11 * kS).ok());
  // The loop ran again at 15 s, after 4 s without a look: 5 s since "quiet" was heard.
  b.excuse_silence_until(15 * kS);
  EXPECT_TRUE(b.check(15 * kS).empty());
  EXPECT_TRUE(b.check(18 * kS).empty());           // 3 s since the stall: within 3 x 1 s
  ASSERT_TRUE(b.heartbeat("loud", 16 * kS).ok());  // what it sent is read
  // Silent since the stall ended: dead at the usual timeout after it, and only that one.
  EXPECT_EQ(b.check(18 * kS + 1), std::vector<MachineId>{quiet});
  EXPECT_TRUE(b.check(19 * kS).empty());
  EXPECT_EQ(b.check(19 * kS + 1), std::vector<MachineId>{loud});
  // An earlier excuse does not move a later one back.
  b.excuse_silence_until(12 * kS);
  ASSERT_TRUE(b.heartbeat("loud", 20 * kS).ok());
  EXPECT_EQ(b.check(23 * kS + 1), std::vector<MachineId>{loud});
}

// Issue 32, finding 4: after a restart every verdict is unknown (the machine is not
// usable, so not "failing"): a first verdict of failed kept its tasks where they were.
// A machine found failed while it was not usable yet (after a restart, or preparing its
// profile) loses its tasks as a failing one does, once.
TEST(Broker, AFailedVerdictWhileNotUsableYetLosesTheMachinesTasks) {
  Allocator a;
  Broker b(a, BrokerConfig{1 * kS, 3, 60 * kS});
  MachineId m = *b.register_machine(info("m", "r1"), 100 * kS);  // restored: unknown
  b.begin_failover_grace(100 * kS);
  EXPECT_FALSE(b.usable(m));
  EXPECT_TRUE(b.take_failed().empty());
  ASSERT_TRUE(b.health("m", "failed", 101 * kS).ok());
  EXPECT_EQ(b.take_failed(), std::vector<MachineId>{m});
  ASSERT_TRUE(b.health("m", "failed", 102 * kS).ok());  // still failed: reported once
  EXPECT_TRUE(b.take_failed().empty());
  ASSERT_TRUE(b.health("m", "ok", 103 * kS).ok());
  EXPECT_TRUE(b.usable(m));
  ASSERT_TRUE(b.health("m", "failed", 104 * kS).ok());  // usable, then failed: as before
  EXPECT_EQ(b.take_failed(), std::vector<MachineId>{m});

  // Preparing: in an entitlement whose profile it does not run yet.
  Allocator a2;
  Broker b2(a2, BrokerConfig{1 * kS, 3});
  MachineId p = *b2.register_machine(info("p", "r1"), 0);
  auto e = b2.entitlements().create({"db", 1, "db-profile", "", {}, {}});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(b2.health("p", "ok", 1).ok());
  ASSERT_TRUE(a2.assign(p, *e).ok());
  b2.take_ready();
  ASSERT_TRUE(b2.health("p", "ok", 2).ok());
  EXPECT_EQ(b2.state_of(p), "preparing");  // its profile is not applied yet
  (void)b2.take_failed();
  ASSERT_TRUE(b2.health("p", "failed", 3).ok());
  EXPECT_EQ(b2.take_failed(), std::vector<MachineId>{p});
}

TEST(Broker, FailoverGraceConfig) {
  auto d = parse_cp_config("", "cp.toml");
  ASSERT_TRUE(d.ok()) << d.error().str();
  EXPECT_EQ(d->broker.failover_grace_us, 60 * kS);
  auto c = parse_cp_config("failover_grace = \"5m\"\n", "cp.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->broker.failover_grace_us, 300 * kS);
  for (const char* bad : {"failover_grace = \"soon\"\n", "failover_grace = \"2h\"\n"}) {
    auto e = parse_cp_config(std::string("\n") + bad, "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:2"), std::string::npos) << e.error().str();
    EXPECT_NE(e.error().str().find("failover_grace"), std::string::npos) << e.error().str();
  }
}

// The machines' lease (docs/jobs.md, "At most one copy"): derived from the heartbeat
// unless set; a fence_after that leaves no room for the fenced stop, or that one lost
// answer would reach, names its key and line.
TEST(Broker, LeaseConfig) {
  auto d = parse_cp_config("", "cp.toml");
  ASSERT_TRUE(d.ok()) << d.error().str();
  EXPECT_EQ(d->broker.lease(), 8 * kS);  // 4 x the shipped 2 s heartbeat
  EXPECT_EQ(d->broker.fence_after(), 4 * kS);
  EXPECT_EQ(d->broker.lease_margin(), 180'000u);
  auto fast = parse_cp_config("heartbeat_interval = \"200ms\"\n", "cp.toml");
  ASSERT_TRUE(fast.ok()) << fast.error().str();
  EXPECT_EQ(fast->broker.lease(), 4 * kS);  // at least 4 s
  auto c = parse_cp_config("machine_lease = \"12s\"\nfence_after = \"5s\"\n", "cp.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->broker.lease(), 12 * kS);
  EXPECT_EQ(c->broker.fence_after(), 5 * kS);
  for (const char* bad : {"fence_after = \"7500ms\"\n", "fence_after = \"2s\"\n",
                          "machine_lease = \"soon\"\n", "machine_lease = \"1h\"\n"}) {
    auto e = parse_cp_config(std::string("\n") + bad, "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:2"), std::string::npos) << e.error().str();
  }
  Allocator alloc;
  BrokerConfig cfg;
  Broker b(alloc, cfg);
  auto m = b.register_machine({"m", "dc", "r", "a", {1000, 1024}}, 10 * kS);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(b.lease_end_us(*m), 18 * kS + 180'000);
  ASSERT_TRUE(b.heartbeat("m", 12 * kS).ok());
  EXPECT_EQ(b.lease_end_us(*m), 20 * kS + 180'000);  // counted from when it was last heard
}

// The ReBalancer's settings: defaults, a table, dotted keys; bad values name the key and
// its line; durations converted by one reader also keep their old errors.
TEST(Broker, RebalancerConfig) {
  auto d = parse_cp_config("", "cp.toml");
  ASSERT_TRUE(d.ok()) << d.error().str();
  EXPECT_TRUE(d->rebalancer.enabled);
  EXPECT_EQ(d->rebalancer.interval_us, 60 * kS);
  EXPECT_EQ(d->rebalancer.moves_per_round, 5);
  EXPECT_EQ(d->rebalancer.moves_per_hour, 30);
  EXPECT_EQ(d->rebalancer.move_timeout_us, 600 * kS);
  auto c = parse_cp_config(
      "[rebalancer]\nenabled = false\ninterval = \"5m\"\nmoves_per_round = 0\n"
      "moves_per_hour = 200\nmove_timeout = \"30s\"\n",
      "cp.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_FALSE(c->rebalancer.enabled);
  EXPECT_EQ(c->rebalancer.interval_us, 300 * kS);
  EXPECT_EQ(c->rebalancer.moves_per_round, 0);
  EXPECT_EQ(c->rebalancer.moves_per_hour, 200);
  EXPECT_EQ(c->rebalancer.move_timeout_us, 30 * kS);
  auto dotted =
      parse_cp_config("rebalancer.enabled = false\nautoscale_interval = \"2s\"\n", "cp.toml");
  ASSERT_TRUE(dotted.ok()) << dotted.error().str();
  EXPECT_FALSE(dotted->rebalancer.enabled);
  EXPECT_EQ(dotted->autoscale_interval_us, 2 * kS);
  for (auto [bad, key] : {std::pair{"interval = \"0s\"", "rebalancer.interval"},
                          {"interval = \"2h\"", "rebalancer.interval"},
                          {"move_timeout = \"1s\"", "rebalancer.move_timeout"},
                          {"moves_per_round = -1", "rebalancer.moves_per_round"},
                          {"moves_per_hour = 100001", "rebalancer.moves_per_hour"},
                          {"enabled = \"yes\"", "enabled"},
                          {"often = true", "often"}}) {
    auto e = parse_cp_config(std::string("[rebalancer]\n") + bad + "\n", "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:2"), std::string::npos) << e.error().str();
    EXPECT_NE(e.error().str().find(key), std::string::npos) << e.error().str();
  }
  for (auto [bad, text] :
       {std::pair{"prepare_timeout = \"0s\"", "'prepare_timeout' must be a duration from 1s to 1h"},
        {"discovery_ack_timeout = \"1h\"", "'discovery_ack_timeout' must be a duration from 100ms"},
        {"autoscale_interval = \"20m\"",
         "'autoscale_interval' must be a duration from 1s to 10m"}}) {
    auto e = parse_cp_config(std::string("\n") + bad + "\n", "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:2"), std::string::npos) << e.error().str();
    EXPECT_NE(e.error().str().find(text), std::string::npos) << e.error().str();
  }
}

// The web view has no authentication of its own: plain HTTP on loopback only.
TEST(Broker, WebListenIsLoopbackOnly) {
  for (const char* ok : {"127.0.0.1:9480", "[::1]:9480"}) {
    auto c = parse_cp_config(std::string("web_listen = \"") + ok + "\"\n", "cp.toml");
    ASSERT_TRUE(c.ok()) << ok << ": " << c.error().str();
    EXPECT_EQ(c->web_listen, ok);
  }
  for (const char* bad :
       {"0.0.0.0:9480", "10.1.2.3:9480", "/run/weft/web.sock", "127.0.0.1", "[::]:9480"}) {
    auto e = parse_cp_config(std::string("\nweb_listen = \"") + bad + "\"\n", "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:2"), std::string::npos) << e.error().str();
    EXPECT_NE(e.error().str().find("loopback"), std::string::npos) << e.error().str();
  }
  EXPECT_EQ(parse_cp_config("", "cp.toml")->web_listen, "");
}

// A region's broker groups: one (`brokers = "..."`, group "default") or several, each
// named (after its datacenter); a broker names its own group.
TEST(Broker, RegionBrokerGroupsConfig) {
  const std::string etcd =
      "[store]\nkind = \"etcd\"\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n";
  auto one = parse_cp_config(etcd +
                                 "[region]\nrole = \"shard\"\nshard = \"s1\"\nbrokers = "
                                 "\"b1:7070,b2:7070\"\n",
                             "cp.toml");
  ASSERT_TRUE(one.ok()) << one.error().str();
  EXPECT_EQ(one->region.brokers,
            (std::map<std::string, std::string>{{"default", "b1:7070,b2:7070"}}));
  auto two = parse_cp_config(etcd +
                                 "[region]\nrole = \"shard\"\nshard = \"s1\"\n"
                                 "[region.brokers]\ndc1 = \"b1:7070\"\ndc2 = \"b3:7070,b4:7070\"\n",
                             "cp.toml");
  ASSERT_TRUE(two.ok()) << two.error().str();
  EXPECT_EQ(two->region.brokers.size(), 2u);
  EXPECT_EQ(two->region.brokers.at("dc2"), "b3:7070,b4:7070");
  auto broker = parse_cp_config(etcd +
                                    "[region]\nrole = \"broker\"\ngroup = \"dc2\"\n"
                                    "[region.shards]\ns1 = \"s:7070\"\n",
                                "cp.toml");
  ASSERT_TRUE(broker.ok()) << broker.error().str();
  EXPECT_EQ(broker->region.group, "dc2");
  EXPECT_EQ(parse_cp_config("", "cp.toml")->region.group, "default");
  // Each refusal names the line and what is wrong.
  for (const char* bad :
       {"[region]\ngroup = \"DC 1\"\n", "[region]\nbrokers = 7\n", "[region]\nbrokers = \"\"\n",
        "[region.brokers]\n\"dc/1\" = \"b1:7070\"\n", "[region.brokers]\ndc1 = 5\n",
        "[region.brokers]\ndc1 = \"b1:notaport\"\n"}) {
    auto e = parse_cp_config(std::string(bad), "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:"), std::string::npos) << e.error().str();
  }
}

TEST(Broker, HealthVerdictsAndDrain) {
  Allocator a;
  Broker b(a);
  MachineId m = *b.register_machine(info("h", "r1"), 0);
  ASSERT_TRUE(b.health("h", "degraded", 0).ok());
  EXPECT_TRUE(b.usable(m));  // degraded still takes tasks
  b.take_ready();
  ASSERT_TRUE(b.health("h", "failed", 1).ok());
  EXPECT_FALSE(b.usable(m));
  EXPECT_EQ(b.take_failed(), std::vector<MachineId>{m});
  EXPECT_EQ(b.unavailability().all().back().kind, "failed");
  EXPECT_EQ(b.health("h", "bogus", 1).error().field, "verdict");
  ASSERT_TRUE(b.health("h", "ok", 2).ok());
  ASSERT_TRUE(b.drain("h", true, 3).ok());
  EXPECT_FALSE(b.usable(m));
  EXPECT_EQ(b.state_of(m), "drained");
  EXPECT_EQ(b.unavailability().all().back().kind, "drain");
}

TEST(Broker, EntitlementQuotaProfileAndPendingTasks) {
  Allocator a;
  Broker b(a);
  register_healthy(b, 3);
  if (HasFatalFailure()) return;
  auto e = b.entitlements().create({"web", 2, "web", ""});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(b.entitlements().create({"web", 1, "", ""}).error().field, "name");
  EXPECT_EQ(b.entitlements().create({"x", 0, "", ""}).error().field, "quota");

  Scheduler s(a);
  place_when_prepared(s, b);
  JobSpec j = site(*e, 2);
  j.per_task = {4000, 1024};  // a whole machine each
  auto c = s.create(j, 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  // Both machines joined the entitlement but run no "web" profile yet: nothing starts.
  EXPECT_TRUE(c->empty());
  for (const auto& t : s.tasks().of_job("site")) {
    EXPECT_EQ(t.state, TaskState::kPending);
    EXPECT_EQ(b.desired_profile(t.machine), "web");  // what sidekick is told to apply
  }
  b.take_ready();
  MachineId first = s.tasks().of_job("site")[0].machine;
  EXPECT_EQ(b.state_of(first), "preparing");
  ASSERT_TRUE(b.profile_applied(a.spec(first).name, "web").ok());  // sidekick reports
  auto ready = b.take_ready();
  ASSERT_EQ(ready, std::vector<MachineId>{first});
  auto started = s.placer().machine_ready(first, 1);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].machine, first);
  // The quota (2) stops a third machine from joining.
  JobSpec more = j;
  more.name = "more";
  more.count = 1;
  EXPECT_FALSE(s.create(more, 2).ok());
}

// Issue 32 (6): a machine that never applies its entitlement's profile is marked after
// prepare_timeout; the tasks waiting on it are LOST with the reason and placed on a
// machine that is ready; the mark ends when its sidekick applies the profile.
TEST(Broker, AMachineThatDoesNotPrepareInTimeIsMarkedAndItsTasksMove) {
  Allocator a;
  BrokerConfig cfg;
  cfg.prepare_timeout_us = 10'000'000;
  Broker b(a, cfg);
  register_healthy(b, 2);
  if (HasFatalFailure()) return;
  auto e = b.entitlements().create({"web", 2, "web", ""});
  ASSERT_TRUE(e.ok());
  Scheduler s(a);
  place_when_prepared(s, b);
  JobSpec j = site(*e, 1);
  j.per_task = {1000, 256};
  auto c = s.create(j, 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  MachineId slow = s.tasks().of_job("site")[0].machine;
  MachineId other = slow == 0 ? 1 : 0;
  b.take_ready();  // the machine joined: it prepares from now
  // The other machine is in the entitlement and ready (its profile applied).
  ASSERT_TRUE(a.assign(other, *e).ok());
  ASSERT_TRUE(b.profile_applied(a.spec(other).name, "web").ok());
  b.take_ready();
  EXPECT_TRUE(b.take_unprepared(9'000'000).empty());
  auto late = b.take_unprepared(10'000'001);
  ASSERT_EQ(late, std::vector<MachineId>{slow});
  b.mark_unprepared(slow, "no weft-sidekick session", 10'000'001);
  EXPECT_EQ(b.state_of(slow), "unprepared");
  EXPECT_FALSE(b.usable(slow));
  EXPECT_EQ(b.unprepared_reason(slow), "no weft-sidekick session");
  auto cmds = s.placer().machine_unprepared(slow, "no weft-sidekick session", 10'000'001);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_EQ(cmds[0].kind, Command::Kind::kStart);
  EXPECT_EQ(cmds[0].machine, other);
  for (const auto& t : s.tasks().of_job("site"))
    if (t.machine == slow) {
      EXPECT_EQ(t.state, TaskState::kLost);
      EXPECT_EQ(t.message, "no weft-sidekick session");
    }
  EXPECT_TRUE(b.take_unprepared(20'000'000).empty()) << "marked once";
  // Its sidekick applies the profile after all: the mark ends.
  ASSERT_TRUE(b.profile_applied(a.spec(slow).name, "web").ok());
  EXPECT_EQ(b.unprepared_reason(slow), "");
  EXPECT_TRUE(b.usable(slow));
}

// Sidekick can apply the profile and report it before the broker refreshed the machine
// after it joined (the push and the report take milliseconds): the waiting tasks start.
TEST(Broker, ProfileReportedBeforeAnyRefreshStillWakesTasks) {
  Allocator a;
  Broker b(a);
  ASSERT_TRUE(b.register_machine(info("h0", "r0"), 0).ok());
  ASSERT_TRUE(b.health("h0", "ok", 0).ok());
  b.take_ready();  // usable as a free machine
  auto e = b.entitlements().create({"web", 1, "web", ""});
  ASSERT_TRUE(e.ok());
  Scheduler s(a);
  place_when_prepared(s, b);
  JobSpec j = site(*e, 1);
  ASSERT_TRUE(s.create(j, 0).ok());
  EXPECT_EQ(s.tasks().of_job("site")[0].state, TaskState::kPending);
  ASSERT_TRUE(b.profile_applied("h0", "web").ok());
  auto ready = b.take_ready();
  ASSERT_FALSE(ready.empty());
  EXPECT_EQ(s.placer().machine_ready(ready[0], 1).size(), 1u);
  EXPECT_EQ(s.tasks().of_job("site")[0].state, TaskState::kStarting);
}

// Issue 13: over TLS a machine's session speaks for the machine its certificate names.
TEST(MachineIdentity, TheCertificateNamesTheMachine) {
  rpc::Peer unix_peer;
  unix_peer.is_unix = true;
  EXPECT_TRUE(check_machine_identity(unix_peer, "m1").ok());  // local: not bound
  rpc::Peer p;
  p.tls = true;
  p.identity.common_name = "m1";
  p.identity.subject = "CN=m1,OU=machine";
  p.identity.dns = {"m1", "m1.rack7.example"};
  EXPECT_TRUE(check_machine_identity(p, "m1").ok());
  EXPECT_TRUE(check_machine_identity(p, "m1.rack7.example").ok());
  auto other = check_machine_identity(p, "m2");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code, rpc::kPermissionDenied);
  EXPECT_NE(other.error().str().find("CN=m1"), std::string::npos);
}

// [access] patterns: what each kind matches, the highest role wins, and a bad pattern in
// controlplane.toml is refused naming its key and line.
TEST(Access, PatternsRolesAndConfigErrors) {
  tls::Identity id;
  id.subject = "CN=alice,OU=team-web,OU=operator,O=example";
  id.common_name = "alice";
  id.units = {"team-web", "operator"};
  id.dns = {"alice.example"};
  for (const char* yes : {"CN=alice", "OU=team-web", "O=example", "DNS=alice.example",
                          "CN=alice,OU=team-web,OU=operator,O=example"})
    EXPECT_TRUE(principal_matches(yes, id)) << yes;
  for (const char* no : {"CN=bob", "OU=admin", "O=exam", "DNS=bob.example", "CN=alice,O=example"})
    EXPECT_FALSE(principal_matches(no, id)) << no;
  AccessConfig a;
  EXPECT_EQ(a.role_of(id), Role::kOperator);
  EXPECT_FALSE(a.is_machine(id));
  a.admin = {"O=example"};
  EXPECT_EQ(a.role_of(id), Role::kAdmin);
  for (const char* bad : {"", "alice", "=x", "CN=", "SN=alice", "CN=a\nb"})
    EXPECT_FALSE(check_principal_pattern(bad).ok()) << bad;
  auto conf = parse_cp_config("[access]\nviewer = [\"OU=ok\", \"nope\"]\n", "cp.toml");
  ASSERT_FALSE(conf.ok());
  EXPECT_NE(conf.error().str().find("cp.toml:2"), std::string::npos) << conf.error().str();
  EXPECT_NE(conf.error().str().find("access.viewer"), std::string::npos) << conf.error().str();
  EXPECT_FALSE(parse_cp_config("[access]\nroot = [\"OU=x\"]\n", "cp.toml").ok());
  auto ok = parse_cp_config("[access]\nadmin = [\"CN=root\"]\n", "cp.toml");
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(ok->access.admin, std::vector<std::string>{"CN=root"});
  EXPECT_EQ(ok->access.machine, std::vector<std::string>{"OU=machine"});  // default kept
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

using nlohmann::json;

// Entitlement "web" at profile "old" with machines m0..m{n-1}, healthy, assigned to it,
// each having applied "old"; their ids in *ms.
void web_at_old(Allocator& a, Broker& b, int n, EntitlementId* e, std::vector<MachineId>* ms) {
  auto made =
      b.entitlements().create(EntitlementSpec{"web", static_cast<size_t>(n), "old", "", {}, {}});
  ASSERT_TRUE(made.ok());
  *e = *made;
  for (int i = 0; i < n; ++i) {
    std::string id = "m" + std::to_string(i);
    auto m = b.register_machine(info(id, "r" + std::to_string(i)), 0);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(b.health(id, "ok", 0).ok());
    ASSERT_TRUE(a.assign(*m, *e).ok());
    ASSERT_TRUE(b.profile_applied(id, "old").ok());
    ms->push_back(*m);
  }
}

// A new profile rolls over an entitlement's machines one at a time: each is held at the
// old one until its turn, the next goes once it applied the new one (or died), and a
// removed entitlement lets go of what it held.
TEST(ProfileRolls, MachinesSwitchInTurnAtThePace) {
  Allocator a;
  Broker b(a);
  EntitlementId e0 = 0;
  std::vector<MachineId> ms;
  web_at_old(a, b, 3, &e0, &ms);
  if (HasFatalFailure()) return;
  const EntitlementId* e = &e0;
  Notes notes;
  ProfileRolls rolls(a, b, notes);
  b.entitlements().set_profile(*e, "new");
  rolls.start(*e, "old", 1);
  for (MachineId m : ms) EXPECT_EQ(b.desired_profile(m), "old");  // all held
  auto name = [&](MachineId m) { return b.persisted(m).info.id; };
  EXPECT_EQ(rolls.advance(), std::set<MachineId>{ms[0]});
  EXPECT_EQ(b.desired_profile(ms[0]), "new");
  EXPECT_EQ(b.desired_profile(ms[1]), "old");
  EXPECT_TRUE(rolls.advance().empty());  // m0 has not applied it yet
  json status = rolls.status(*e, name);
  EXPECT_EQ(status["applying"], json::array({"m0"}));
  EXPECT_EQ(status["waiting"], json::array({"m1", "m2"}));
  ASSERT_TRUE(b.profile_applied("m0", "new").ok());
  EXPECT_EQ(rolls.advance(), std::set<MachineId>{ms[1]});
  ASSERT_TRUE(b.health("m1", "failed", 1).ok());  // a machine that dies is not waited for
  EXPECT_EQ(rolls.advance(), std::set<MachineId>{ms[2]});
  ASSERT_TRUE(b.profile_applied("m2", "new").ok());
  EXPECT_TRUE(rolls.advance().empty());
  EXPECT_FALSE(rolls.rolling(*e));
  EXPECT_EQ(rolls.status(*e, name), (json{{"done", true}}));

  // At pace 2 two go at once; forgetting the roll lets go of the rest.
  b.entitlements().set_profile(*e, "newer");
  rolls.start(*e, "new", 2);
  EXPECT_EQ(rolls.advance().size(), 2u);
  rolls.forget(*e);
  EXPECT_FALSE(rolls.rolling(*e));
  for (MachineId m : ms) EXPECT_EQ(b.desired_profile(m), "newer");
}

// A roll's progress is a note, written as it moves: a new leader (a restart, a failover)
// that reads it goes on where the roll was, the machines still waiting held at the old
// profile again, not all switched at once.
TEST(ProfileRolls, AResumedRollGoesOnWhereItWas) {
  Allocator a;
  Broker b(a);
  EntitlementId e0 = 0;
  std::vector<MachineId> ms;
  web_at_old(a, b, 4, &e0, &ms);
  if (HasFatalFailure()) return;
  const EntitlementId* e = &e0;
  Notes notes;
  ProfileRolls rolls(a, b, notes);
  b.entitlements().set_profile(*e, "new");
  rolls.start(*e, "old", 1);
  EXPECT_EQ(rolls.advance(), std::set<MachineId>{ms[0]});
  ASSERT_TRUE(b.profile_applied("m0", "new").ok());
  EXPECT_EQ(rolls.advance(), std::set<MachineId>{ms[1]});
  // What the store holds now: the latest value of each note.
  std::map<std::string, json> stored;
  for (auto& [key, value] : notes.take())
    if (value) stored[key] = *value;
  const std::string key = "profile-roll/" + std::to_string(*e);
  ASSERT_EQ(stored.count(key), 1u);
  EXPECT_EQ(stored[key]["applying"], json::array({"m1"}));
  EXPECT_EQ(stored[key]["waiting"], json::array({"m2", "m3"}));
  // The leader dies: a new one starts with no holds (its broker is new) and no rolls.
  rolls.forget(*e);
  for (MachineId m : ms) ASSERT_FALSE(b.profile_held(m));
  Notes after;
  ProfileRolls resumed(a, b, after);
  stored["profile-roll/99"] = stored[key];       // an entitlement that is gone
  stored["profile-roll/x"] = json{{"from", 3}};  // and a note it cannot read
  resumed.restore(stored);
  ASSERT_TRUE(resumed.rolling(*e));
  EXPECT_TRUE(b.profile_held(ms[2]));
  EXPECT_TRUE(b.profile_held(ms[3]));
  EXPECT_EQ(b.desired_profile(ms[3]), "old");
  EXPECT_TRUE(resumed.advance().empty()) << "m1 still applying: nothing more goes";
  ASSERT_TRUE(b.profile_applied("m1", "new").ok());
  EXPECT_EQ(resumed.advance(), std::set<MachineId>{ms[2]});
  auto written = after.take();
  EXPECT_EQ(written.count("profile-roll/99"), 1u);
  EXPECT_FALSE(written["profile-roll/99"].has_value()) << "the stale note is erased";
  ASSERT_TRUE(written[key].has_value());
  EXPECT_EQ((*written[key])["waiting"], json::array({"m3"}));
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// web_hosts: host names only (no port, no path); the defaults come with web_listen.
TEST(CpConfig, WebHostsAreNamesAndAddTheirOwn) {
  auto c = parse_cp_config("web_listen = \"127.0.0.1:9480\"\nweb_hosts = [\"fleet.example\"]\n",
                           "cp.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->web_hosts, (std::vector<std::string>{"localhost", "127.0.0.1", "[::1]", "127.0.0.1",
                                                    "fleet.example"}));
  for (const char* bad : {"[\"a/b\"]", "[\"\"]", "[\"x y\"]", "\"one\""}) {
    auto e = parse_cp_config(std::string("\nweb_hosts = ") + bad + "\n", "cp.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("cp.toml:2"), std::string::npos) << e.error().str();
  }
}

}  // namespace
}  // namespace weft::cp
