#include "controlplane/maintenance/maintenance.h"

#include <gtest/gtest.h>

#include "common/rpc/protocol.h"

namespace weft::cp {
namespace {

using json = nlohmann::json;
constexpr int64_t kMinute = 60'000'000;
constexpr int64_t kNow = 1'800'000'000'000'000;  // 2027-01-15, wall clock in us

// The cluster as the planner sees it: three machines of one rack, one of them drained by
// an operator before anything was scheduled.
struct FakeWorld {
  std::map<std::string, bool> drained = {{"m1", false}, {"m2", false}, {"m3", true}};
  std::set<std::string> busy = {"m1", "m2"};  // run tasks
  std::set<std::string> healthy = {"m1", "m2", "m3"};
  std::map<std::string, std::string> boot = {{"m1", "b1"}, {"m2", "b2"}, {"m3", "b3"}};
  std::vector<std::string> evicted, rebooted;
  bool sidekick = true;
  Maintenance::World world() {
    Maintenance::World w;
    w.machines_of = [](const MaintenanceEvent& e) {
      if (e.target_kind == "machine") return std::vector<std::string>{e.target};
      return std::vector<std::string>{"m1", "m2", "m3"};
    };
    w.is_drained = [this](const std::string& m) { return drained[m]; };
    w.set_drained = [this](const std::string& m, bool on) { drained[m] = on; };
    w.evict = [this](const std::string& m) {
      evicted.push_back(m);
      busy.erase(m);
    };
    w.empty = [this](const std::string& m) { return !busy.count(m); };
    w.healthy = [this](const std::string& m) { return healthy.count(m) > 0; };
    w.reboot = [this](const std::string& m) {
      if (!sidekick) return false;
      rebooted.push_back(m);
      healthy.erase(m);
      return true;
    };
    w.boot_id = [this](const std::string& m) { return boot[m]; };
    return w;
  }
};

MaintenanceEvent rack_event(bool reboot) {
  auto e = parse_maintenance_request({{"domain", "rack1"},
                                      {"start", "+30m"},
                                      {"duration", "1h"},
                                      {"notice", "10m"},
                                      {"reason", "kernel 6.19"},
                                      {"reboot", reboot}},
                                     kNow);
  EXPECT_TRUE(e.ok()) << e.error().str();
  return *e;
}

TEST(Maintenance, ANoticeDrainsTheDeadlineEvictsRebootsAndHealthyMachinesReturn) {
  Maintenance plan;
  FakeWorld f;
  auto w = f.world();
  auto id = plan.schedule(rack_event(true));
  ASSERT_TRUE(id.ok());
  // Before the notice: nothing happens.
  EXPECT_TRUE(plan.step(w, kNow + 19 * kMinute).empty());
  EXPECT_FALSE(f.drained["m1"]);
  EXPECT_TRUE(plan.affecting("m1").empty());
  // Notice (10 minutes before the start): drained; the operator's drain stays theirs.
  EXPECT_EQ(plan.step(w, kNow + 20 * kMinute).size(), 1u);
  const MaintenanceEvent& e = plan.events().at(*id);
  EXPECT_EQ(e.state, "notified");
  EXPECT_TRUE(f.drained["m1"] && f.drained["m2"]);
  EXPECT_EQ(e.drained, (std::set<std::string>{"m1", "m2"}));
  EXPECT_EQ(plan.affecting("m3").size(), 1u);  // affected all the same
  EXPECT_TRUE(f.evicted.empty());
  // The deadline: what is left is stopped, and empty machines are told to reboot.
  plan.step(w, kNow + 30 * kMinute);
  EXPECT_EQ(e.state, "in_progress");
  EXPECT_EQ(f.evicted.size(), 3u);
  EXPECT_EQ(f.rebooted, (std::vector<std::string>{"m1", "m2", "m3"}));
  // m1 comes back with a new boot id; m2 registers again without having rebooted.
  f.boot["m1"] = "b1-new";
  plan.registered("m1", "b1-new", kNow + 35 * kMinute);
  plan.registered("m2", "b2", kNow + 35 * kMinute);
  f.healthy = {"m1", "m2", "m3"};
  // The end of the window: m1 returns; m2 has not rebooted yet, so it waits drained.
  plan.step(w, kNow + 90 * kMinute);
  EXPECT_EQ(e.state, "completing");
  EXPECT_FALSE(f.drained["m1"]);
  EXPECT_TRUE(f.drained["m2"]);
  EXPECT_TRUE(f.drained["m3"]);  // the operator's drain is not undone
  EXPECT_NE(e.message.find("m2"), std::string::npos) << e.message;
  plan.registered("m2", "b2-new", kNow + 91 * kMinute);
  plan.step(w, kNow + 92 * kMinute);
  EXPECT_EQ(e.state, "done");
  EXPECT_FALSE(f.drained["m2"]);
  EXPECT_TRUE(f.drained["m3"]);
  // It survives a restart as it was.
  auto back = maintenance_from_json(to_json(e));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(to_json(*back), to_json(e));
}

TEST(Maintenance, AMachineIsNotRebootedWhileItRunsSomethingAndCancelReturnsItAtOnce) {
  Maintenance plan;
  FakeWorld f;
  f.sidekick = false;  // nobody to ask yet
  auto w = f.world();
  auto ev = rack_event(true);
  ev.target_kind = "machine";
  ev.target = "m1";
  auto id = plan.schedule(ev);
  ASSERT_TRUE(id.ok());
  plan.step(w, kNow + 30 * kMinute);  // notice and start in one step
  const MaintenanceEvent& e = plan.events().at(*id);
  EXPECT_EQ(e.state, "in_progress");
  EXPECT_TRUE(f.rebooted.empty());
  EXPECT_NE(e.message.find("waiting to reboot m1"), std::string::npos) << e.message;
  f.sidekick = true;
  plan.step(w, kNow + 31 * kMinute);
  EXPECT_EQ(f.rebooted, (std::vector<std::string>{"m1"}));
  EXPECT_TRUE(plan.cancel(*id, w));
  EXPECT_EQ(e.state, "cancelled");
  EXPECT_FALSE(f.drained["m1"]);
  EXPECT_FALSE(plan.cancel(*id, w));  // ended already
  EXPECT_TRUE(plan.affecting("m1").empty());
}

TEST(Maintenance, OverlappingEventsHoldAMachineUntilBothEnd) {
  Maintenance plan;
  FakeWorld f;
  auto w = f.world();
  auto a = rack_event(false);
  auto b = rack_event(false);
  b.target_kind = "machine";
  b.target = "m1";
  b.duration_us = 3 * 60 * static_cast<uint64_t>(kMinute);
  auto ia = plan.schedule(a), ib = plan.schedule(b);
  ASSERT_TRUE(ia.ok() && ib.ok());
  plan.step(w, kNow + 30 * kMinute);
  EXPECT_TRUE(f.drained["m1"]);
  plan.step(w, kNow + 91 * kMinute);  // a ends; b still holds m1
  EXPECT_EQ(plan.events().at(*ia).state, "done");
  EXPECT_TRUE(f.drained["m1"]);
  EXPECT_FALSE(f.drained["m2"]);
  plan.step(w, kNow + 211 * kMinute);
  EXPECT_EQ(plan.events().at(*ib).state, "done");
  EXPECT_FALSE(f.drained["m1"]);
}

TEST(Maintenance, ARegionsIdIsTakenAsGivenAndNeverAsOneOfItsOwn) {
  Maintenance plan;
  auto own = plan.schedule(rack_event(false));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, 1u);
  uint64_t region = Maintenance::kRegionIds + 7;
  auto given = plan.schedule(rack_event(false), region);
  ASSERT_TRUE(given.ok()) << given.error().str();
  EXPECT_EQ(*given, region);
  auto twice = plan.schedule(rack_event(false), region);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, rpc::kConflict);
  auto low = plan.schedule(rack_event(false), 5);  // an id of its own is not the caller's
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(low.error().field, "id");
  // Restored, a region's event does not move this control plane's own ids into the
  // region's range: the next own id follows the own ones.
  Maintenance again;
  MaintenanceEvent r = plan.events().at(region);
  again.restore(r);
  again.restore(plan.events().at(1));
  auto next = again.schedule(rack_event(false));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 2u);
}

TEST(Maintenance, RequestsAreCheckedFieldByField) {
  struct Bad {
    json p;
    const char* field;
  };
  for (const Bad& b : std::vector<Bad>{
           {{{"start", "+1h"}, {"duration", "1h"}}, "machine"},
           {{{"machine", "m"}, {"dc", "d"}, {"start", "+1h"}, {"duration", "1h"}}, "machine"},
           {{{"machine", ""}, {"start", "+1h"}, {"duration", "1h"}}, "machine"},
           {{{"machine", "m"}, {"duration", "1h"}}, "start"},
           {{{"machine", "m"}, {"start", "tomorrow"}, {"duration", "1h"}}, "start"},
           {{{"machine", "m"}, {"start", "2026-02-30T10:00:00Z"}, {"duration", "1h"}}, "start"},
           {{{"machine", "m"}, {"start", "2020-01-01T00:00:00Z"}, {"duration", "1h"}}, "start"},
           {{{"machine", "m"}, {"start", "+1h"}}, "duration"},
           {{{"machine", "m"}, {"start", "+1h"}, {"duration", "500ms"}}, "duration"},
           {{{"machine", "m"}, {"start", "+1h"}, {"duration", "30d"}}, "duration"},
           {{{"machine", "m"}, {"start", "+1h"}, {"duration", "1h"}, {"notice", "-1m"}}, "notice"},
           {{{"machine", "m"}, {"start", "+1h"}, {"duration", "1h"}, {"reboot", "yes"}}, "reboot"},
           {{{"machine", "m"},
             {"start", "+1h"},
             {"duration", "1h"},
             {"reason", std::string(300, 'x')}},
            "reason"},
           {{{"machine", "m"}, {"start", "+1h"}, {"duration", "1h"}, {"rack", "r"}}, "rack"},
       }) {
    auto r = parse_maintenance_request(b.p, kNow);
    ASSERT_FALSE(r.ok()) << b.p.dump();
    EXPECT_EQ(r.error().field, b.field) << b.p.dump() << ": " << r.error().str();
  }
  auto at = parse_maintenance_request(
      {{"dc", "dc1"}, {"start", "2027-01-15T12:00:00Z"}, {"duration", 3600}}, kNow);
  ASSERT_TRUE(at.ok()) << at.error().str();
  EXPECT_EQ(at->start_us, (int64_t{1'800'000'000} + 4 * 3600) * 1'000'000);
  EXPECT_EQ(*parse_rfc3339_utc("1970-01-01T00:01:00Z"), 60'000'000);
  EXPECT_EQ(at->notice_us, 15u * 60'000'000);
  EXPECT_EQ(at->duration_us, 3'600'000'000u);
}

}  // namespace
}  // namespace weft::cp
