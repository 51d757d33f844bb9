// A full disk (issue 61): the control plane's and the agents' state directories each on
// a small tmpfs the test fills until writes fail with ENOSPC, then frees. While full: an
// operator's change is refused with the reason and nothing of it half-applied, the
// machines stay in service (answered from memory), the tasks run on, a start on a full
// agent is refused and placed elsewhere; each daemon says so in its log and a metric.
// Freed: the changes go through, and after a SIGKILL of the control plane every change
// it acknowledged is there and none that it refused. And a slow disk (SlowDisk, below).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "common/fs.h"
#include "tests/agent_harness.h"
#include "tests/cluster_harness.h"

namespace weft::testing {
namespace {

// A metric's value on a daemon's /metrics (the first sample of `name` with `labels`),
// read by curl in the daemon's network namespace; -1 when absent.
double metric(const std::string& netns, int port, const std::string& name) {
  std::string cmd = "timeout 10 ip netns exec " + netns +
                    " curl -sf http://127.0.0.1:" + std::to_string(port) + "/metrics";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  ::pclose(p);
  size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

constexpr int kCpMetrics = 9470, kAgentMetrics = 9471;

class Disks : public ::testing::Test {
 protected:
  explicit Disks(ClusterOptions o) : c_(std::move(o)) {}
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(c_.start_all());
  }
  void TearDown() override {
    // Whatever failed: the fillers go (the mounts go with the harness).
    (void)c_.free_state_fs(-1);
    for (int i = 0; i < c_.machines(); ++i) (void)c_.free_state_fs(i);
  }
  json job(const std::string& name, int count) {
    return json{{"name", name},
                {"entitlement", "e"},
                {"count", count},
                {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
                {"task", {{"argv", {"/bin/sleep", "3600"}}}}};
  }
  int running(const std::string& name) {
    auto r = c_.cp("job.show", {{"name", name}});
    int n = 0;
    if (r.ok())
      for (const auto& t : (*r)["tasks"]) n += t["state"] == "running";
    return n;
  }
  bool wait_running(const std::string& name, int n) {
    return !c_.wait_cp("job.show", {{"name", name}}, [&](const json&) {
                return running(name) == n;
              }).is_null();
  }
  // The control plane SIGKILLed and started again: job.show of `name` once it answers
  // (null if it never does).
  json restart_cp_and_show(const std::string& name) {
    c_.kill_cp(SIGKILL);
    c_.start_cp();
    return c_.wait_cp("job.show", {{"name", name}}, [](const json&) { return true; });
  }
  static bool eventually(const std::function<bool()>& pred, int ms = 30000) {
    for (int waited = 0; waited < ms; waited += 50) {
      if (pred()) return true;
      sleep_ms(50);
    }
    return pred();
  }

  ClusterHarness c_;
};

class DiskFull : public Disks {
 protected:
  DiskFull()
      : Disks([] {
          ClusterOptions o;
          o.machines = 2;
          o.state_fs_size = "16m";
          return o;
        }()) {}
};

// fsync held (weft-test-slowfs: this kernel has neither device-mapper's delay target nor
// cgroup v2's io controller). The control plane commits on its loop's thread (sqlite,
// synchronous=FULL): each group commit holds the loop for the fsync's time, and an
// operator's change (its probe write, its own transaction, its audit entry's group) for
// about three of them. Its replies wait as long, so an agent may count it silent and
// fence its at-most-one tasks (they start again once it answers); what the test holds to
// is what must never give: nothing acknowledged before it is durable, nothing
// acknowledged lost, no machine counted dead, never two copies (docs/operations.md, "A
// slow disk").
constexpr int kFsyncMs = 1200;

class SlowDisk : public Disks {
 protected:
  SlowDisk()
      : Disks([] {
          ClusterOptions o;
          o.machines = 2;
          o.slow_state_fs = true;
          o.heartbeat = "1s";
          o.cp_extra = "machine_lease = \"10s\"\n";
          return o;
        }()) {}
  void TearDown() override {
    (void)c_.set_disk_delay(-1, 0);
    for (int i = 0; i < c_.machines(); ++i) (void)c_.set_disk_delay(i, 0);
    Disks::TearDown();
  }
  json at_most_one(const std::string& name) {
    json j = job(name, 1);
    j["copies"] = "at_most_one";
    return j;
  }
  // The id of the one running task of `name` ("" if none).
  std::string running_id(const std::string& name) {
    auto r = c_.cp("job.show", {{"name", name}});
    if (r.ok())
      for (const auto& t : (*r)["tasks"])
        if (t["state"] == "running") return t["id"];
    return "";
  }
  // Every machine connected and in service, as the control plane says.
  bool all_connected() {
    auto r = c_.cp("machine.ls");
    if (!r.ok()) return false;
    for (const auto& m : (*r)["machines"])
      if (m["connected"] != true) return false;
    return true;
  }
};

TEST_F(DiskFull, TheControlPlanesDiskFullRefusesChangesAndLosesNoneAcknowledged) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 2}, {"profile", "dev"}}).ok());
  ASSERT_TRUE(c_.cp("job.create", job("kept", 1)).ok());
  ASSERT_TRUE(wait_running("kept", 1)) << c_.logs();
  json before = *c_.cp("job.show", {{"name", "kept"}});
  EXPECT_EQ(metric(c_.hub_netns(), kCpMetrics, "weft_cp_commit_failing"), 0);

  ASSERT_TRUE(c_.fill_state_fs(-1).ok());
  // Refused with the reason, and nothing of it applied.
  auto refused = c_.cp("job.create", job("refused", 1));
  ASSERT_FALSE(refused.ok()) << refused->dump();
  EXPECT_NE(refused.error().str().find("No space left"), std::string::npos)
      << refused.error().str();
  EXPECT_FALSE(c_.cp("job.show", {{"name", "refused"}}).ok());
  auto scale = c_.cp("job.scale", {{"name", "kept"}, {"count", 2}});
  EXPECT_FALSE(scale.ok());
  json shown = *c_.cp("job.show", {{"name", "kept"}});
  EXPECT_EQ(shown["spec"]["count"], 1) << "a refused scale was applied:\n" << shown.dump(2);
  // Said in the log and the metrics; the machines still in service meanwhile (their
  // heartbeats answered from memory: more refused groups, one each retry).
  // Three more refused groups after the calls' (one a second, the machines' reports
  // among them): longer than missed_heartbeats, and every machine still connected.
  const double refused_so_far = metric(c_.hub_netns(), kCpMetrics, "weft_cp_commit_failures_total");
  EXPECT_GE(refused_so_far, 2);
  ASSERT_TRUE(eventually([&] {
    return metric(c_.hub_netns(), kCpMetrics, "weft_cp_commit_failing") == 1 &&
           metric(c_.hub_netns(), kCpMetrics, "weft_cp_commit_failures_total") >=
               refused_so_far + 3;
  })) << c_.logs();
  auto cp_log = read_file(c_.dir() + "/cp.log");
  ASSERT_TRUE(cp_log.ok());
  EXPECT_NE(cp_log->find("cannot commit the control plane's state"), std::string::npos);
  EXPECT_NE(cp_log->find("No space left on device"), std::string::npos);
  auto machines = c_.cp("machine.ls");
  ASSERT_TRUE(machines.ok());
  for (const auto& m : (*machines)["machines"]) EXPECT_EQ(m["connected"], true) << m.dump();
  EXPECT_EQ(running("kept"), 1);

  // Space back: the changes go through, and the metric says so.
  ASSERT_TRUE(c_.free_state_fs(-1).ok());
  ASSERT_TRUE(eventually([&] {
    return metric(c_.hub_netns(), kCpMetrics, "weft_cp_commit_failing") == 0;
  })) << c_.logs();
  ASSERT_TRUE(c_.cp("job.create", job("after", 1)).ok());
  ASSERT_TRUE(wait_running("after", 1)) << c_.logs();

  // SIGKILL and a restart: every acknowledged change, none of the refused, and the task
  // that ran through it all is the same one.
  json kept = restart_cp_and_show("kept");
  ASSERT_FALSE(kept.is_null()) << c_.logs();
  EXPECT_EQ(kept["spec"]["count"], 1) << kept.dump(2);
  EXPECT_TRUE(c_.cp("job.show", {{"name", "after"}}).ok());
  EXPECT_FALSE(c_.cp("job.show", {{"name", "refused"}}).ok());
  ASSERT_TRUE(wait_running("kept", 1)) << c_.logs();
  json now = *c_.cp("job.show", {{"name", "kept"}});
  std::string first_id, now_id;
  for (const auto& t : before["tasks"])
    if (t["state"] == "running") first_id = t["id"];
  for (const auto& t : now["tasks"])
    if (t["state"] == "running") now_id = t["id"];
  EXPECT_EQ(first_id, now_id) << "restarted through a full disk:\n" << now.dump(2);
}

TEST_F(DiskFull, AnAgentsDiskFullRefusesStartsThereAndKeepsItsTasks) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 2}, {"profile", "dev"}}).ok());
  ASSERT_TRUE(c_.cp("job.create", job("kept", 1)).ok());
  ASSERT_TRUE(wait_running("kept", 1)) << c_.logs();
  json show = *c_.cp("job.show", {{"name", "kept"}});
  std::string holder;
  for (const auto& t : show["tasks"])
    if (t["state"] == "running") holder = t["machine"];
  int full = c_.machine_index(holder);
  ASSERT_GE(full, 0);
  ASSERT_TRUE(c_.fill_state_fs(full).ok());

  // Its agent's writes fail: a task started on it directly is refused with the reason.
  auto direct = c_.agent(full, "task.run", {{"name", "direct"}, {"argv", {"/bin/sleep", "60"}}});
  ASSERT_FALSE(direct.ok()) << direct->dump();
  EXPECT_NE(direct.error().str().find("No space left"), std::string::npos) << direct.error().str();
  EXPECT_GE(metric(c_.netns(full), kAgentMetrics, "weft_agent_state_write_failures_total"), 1);
  // The control plane's start there is refused with the reason (one task a machine:
  // spread), and not held as a spec that cannot start; the task already there runs on.
  json spread = job("more", 2);
  spread["placement"] = "spread";
  ASSERT_TRUE(c_.cp("job.create", spread).ok());
  json refused = c_.wait_cp("job.show", {{"name", "more"}}, [&](const json& j) {
    for (const auto& t : j["tasks"])
      if (t["machine"] == holder && t["state"] == "failed" &&
          t.value("message", "").find("No space left") != std::string::npos)
        return true;
    return false;
  });
  ASSERT_FALSE(refused.is_null()) << c_.cp("job.show", {{"name", "more"}})->dump(2) << c_.logs();
  EXPECT_EQ(running("kept"), 1);
  json machine = *c_.cp("machine.show", {{"machine", holder}});
  EXPECT_EQ(machine["connected"], true) << machine.dump();

  // Space back: the index that waited starts there too.
  ASSERT_TRUE(c_.free_state_fs(full).ok());
  ASSERT_TRUE(wait_running("more", 2))
      << c_.cp("job.show", {{"name", "more"}})->dump(2) << c_.logs();
}

// The control plane's fsync held kFsyncMs: a change is acknowledged only once durable,
// that much later at least; the machines' silence meanwhile is excused (none counted
// dead, none of their tasks replaced as lost), and every acknowledged change survives a
// SIGKILL.
TEST_F(SlowDisk, TheControlPlanesSlowFsyncDelaysChangesAndLosesNone) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 2}, {"profile", "dev"}}).ok());
  ASSERT_TRUE(c_.cp("job.create", at_most_one("db")).ok());
  ASSERT_TRUE(c_.cp("job.create", job("web", 1)).ok());
  ASSERT_TRUE(wait_running("db", 1) && wait_running("web", 1)) << c_.logs();
  const std::string db = running_id("db");

  ASSERT_TRUE(c_.set_disk_delay(-1, kFsyncMs).ok());
  auto began = std::chrono::steady_clock::now();
  ASSERT_TRUE(c_.cp("job.scale", {{"name", "web"}, {"count", 2}}).ok()) << c_.logs();
  auto took = std::chrono::steady_clock::now() - began;
  EXPECT_GE(took, std::chrono::milliseconds(kFsyncMs)) << "acknowledged before it was durable";
  ASSERT_TRUE(wait_running("web", 2)) << c_.logs();
  ASSERT_TRUE(c_.cp("job.create", job("more", 1)).ok()) << c_.logs();
  ASSERT_TRUE(wait_running("more", 1)) << c_.logs();

  // Fast again; a SIGKILL and a restart: every acknowledged change is there.
  ASSERT_TRUE(c_.set_disk_delay(-1, 0).ok());
  json web = restart_cp_and_show("web");
  ASSERT_FALSE(web.is_null()) << c_.logs();
  EXPECT_EQ(web["spec"]["count"], 2) << web.dump(2);
  EXPECT_TRUE(c_.cp("job.show", {{"name", "more"}}).ok());
  ASSERT_TRUE(wait_running("db", 1) && wait_running("web", 2)) << c_.logs();
  EXPECT_TRUE(eventually([&] { return all_connected(); })) << c_.cp("machine.ls")->dump(2);
  EXPECT_TRUE(c_.log_lacks(-1, "tasks lost"));
  EXPECT_TRUE(c_.log_has(-1, "this control plane was held up"));
  // (Whether db was fenced meanwhile, and restarted, is said for the record.)
  std::cout << "[ slow disk ] db " << (running_id("db") == db ? "ran through" : "was fenced")
            << " a " << kFsyncMs << " ms fsync\n";
}

// An agent's fsync held 5 s: its task store commits without one (synchronous=NORMAL: a
// machine that loses power loses its tasks anyway), so its starts, exits and heartbeats
// go on as before: the control plane never counts it dead and its tasks run on.
TEST_F(SlowDisk, AnAgentsSlowFsyncStartsTasksAndStaysInService) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 2}, {"profile", "dev"}}).ok());
  ASSERT_TRUE(c_.cp("job.create", at_most_one("db")).ok());
  ASSERT_TRUE(wait_running("db", 1)) << c_.logs();
  const std::string db = running_id("db");
  json show = *c_.cp("job.show", {{"name", "db"}});
  int slow = c_.machine_index(show["tasks"][0]["machine"]);
  ASSERT_GE(slow, 0);
  ASSERT_TRUE(c_.set_disk_delay(slow, 5000).ok());
  json spread = job("web", 2);
  spread["placement"] = "spread";  // one on the slow machine
  ASSERT_TRUE(c_.cp("job.create", spread).ok());
  ASSERT_TRUE(wait_running("web", 2)) << c_.logs();
  // A task's whole life there (its exit recorded) while the disk is slow.
  auto ran = c_.agent(slow, "task.run", {{"name", "once"}, {"argv", {"/bin/true"}}});
  ASSERT_TRUE(ran.ok()) << ran.error().str();
  auto waited = c_.agent(slow, "task.wait", {{"id", "once"}});
  ASSERT_TRUE(waited.ok()) << waited.error().str();
  EXPECT_EQ((*waited)["state"], "exited") << waited->dump();
  EXPECT_TRUE(all_connected()) << c_.cp("machine.ls")->dump(2);
  EXPECT_EQ(running_id("db"), db);
  EXPECT_TRUE(c_.log_lacks(-1, "tasks lost"));
  EXPECT_TRUE(c_.log_lacks(slow, "fencing"));
}

}  // namespace
}  // namespace weft::testing
