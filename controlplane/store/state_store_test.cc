// The control plane's state survives a restart: persisted, reopened, restored into fresh
// modules, and the same as before (tasks, placements, free resources, entitlements),
// with ids that do not collide afterwards.
#include "controlplane/store/state_store.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include <filesystem>
#include <map>

#include "common/clock.h"
#include "common/fs.h"
#include "common/strings.h"
#include "controlplane/store/etcd_store.h"
#include "controlplane/store/leader.h"
#include "controlplane/store/notes.h"
#include "testing/etcd_server.h"

namespace weft::cp {
namespace {

// The test's database directory, removed even when an assertion ends the test early.
struct TempDir {
  std::string path = std::filesystem::temp_directory_path() / ("weft-cp-" + random_hex(5));
  TempDir() { EXPECT_TRUE(mkdir_p(path).ok()); }
  ~TempDir() { (void)remove_tree(path); }
};

struct Plane {
  Allocator alloc;
  Broker broker{alloc};
  Scheduler sched{alloc};
};

// A small cluster to persist: machines h0..h{n-1}, healthy, a rack each, the last one
// drained; entitlement "web" with a quota of n; job "site" of `count` tasks of
// `per_task`. What the job's creation sent is in *created.
void make_site(Plane& p, int n, int count, JobResources per_task,
               Result<std::vector<Command>>* created) {
  for (int i = 0; i < n; ++i) {
    std::string id = "h" + std::to_string(i);
    ASSERT_TRUE(
        p.broker.register_machine({id, "dc1", "r" + std::to_string(i), "a", {4000, 8192}}, 0).ok());
    ASSERT_TRUE(p.broker.health(id, "ok", 0).ok());
  }
  auto e = p.broker.entitlements().create({"web", static_cast<size_t>(n), "", ""});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(p.broker.drain("h" + std::to_string(n - 1), true, 0).ok());
  JobSpec j;
  j.name = "site";
  j.entitlement = "web";
  j.entitlement_id = *e;
  j.count = count;
  j.per_task = per_task;
  j.task = {{"argv", {"/bin/sleep", "infinity"}}};
  *created = p.sched.create(j, 0);
  ASSERT_TRUE(created->ok()) << created->error().str();
}

// What the daemon does after each operation, done for everything at once.
void persist_all(Plane& p, StateStore& st) {
  ASSERT_TRUE(st.begin().ok());
  for (const auto& [id, e] : p.broker.entitlements()) ASSERT_TRUE(st.put_entitlement(id, e).ok());
  for (MachineId m = 0; m < p.alloc.machine_count(); ++m)
    ASSERT_TRUE(st.put_machine(m, p.broker.persisted(m), p.alloc.entitlement_of(m)).ok());
  for (const auto& j : p.sched.handover().persisted_jobs())
    ASSERT_TRUE(st.put_job(j, p.alloc.request(j.spec.name), p.alloc.placement(j.spec.name)).ok());
  for (const auto& [id, t] : p.sched.tasks()) ASSERT_TRUE(st.put_task(t).ok());
  ASSERT_TRUE(st.put_task_seq(p.sched.task_seq()).ok());
  ASSERT_TRUE(st.put_events(p.broker.unavailability().take_new()).ok());
  ASSERT_TRUE(st.commit().ok());
}

// Every store test runs against both stores (sqlite and etcd): the same promises.
class Stores : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { etcd_ = new weft::testing::EtcdServer; }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  // The store, opened afresh on what earlier opens wrote (a restart of the daemon).
  Result<std::unique_ptr<StateStore>> open(size_t max_txn_ops = 128) {
    if (GetParam() == "sqlite") return StateStore::open(tmp_.path + "/cp.db");
    if (!etcd_->error().empty()) return make_error(etcd_->error());
    EtcdStoreConfig c;
    c.etcd.endpoints = {etcd_->endpoint()};
    c.prefix = prefix_;
    c.max_txn_ops = max_txn_ops;
    TRY_ASSIGN(auto s, EtcdStore::open(c));
    return std::unique_ptr<StateStore>(std::move(s));
  }
  TempDir tmp_;
  std::string prefix_ = "/test-" + random_hex(4) + "/";
  static inline weft::testing::EtcdServer* etcd_ = nullptr;
};
INSTANTIATE_TEST_SUITE_P(Both, Stores, ::testing::Values("sqlite", "etcd"),
                         [](const auto& p) { return p.param; });

// An operator's `rebalance pause` is kept with the entitlement across a restart (and an
// entitlement stored before the pause existed is not paused).
TEST_P(Stores, AnEntitlementsRebalancePauseIsKept) {
  Plane before;
  auto paused = before.broker.entitlements().create({"web", 1, "", ""});
  auto other = before.broker.entitlements().create({"batch", 1, "", ""});
  ASSERT_TRUE(paused.ok() && other.ok());
  EXPECT_FALSE(before.broker.entitlements().set_rebalance_paused(*paused, true));
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    persist_all(before, **st);
  }
  Plane after;
  auto st = open();
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
  EXPECT_TRUE(after.broker.entitlements().spec(*paused).rebalance_paused);
  EXPECT_FALSE(after.broker.entitlements().spec(*other).rebalance_paused);
}

// Issue 32 (5): a job's secrets (env values, file contents) are sealed in the store
// with the secrets_key, opened on restore, refused without the key, and resealed under
// a rotated key.
TEST_P(Stores, AJobsSecretsAreSealedAtRest) {
  const std::string k1 = "k1 " + std::string(64, '1') + "\n",
                    k2 = "k2 " + std::string(64, '2') + "\n";
  auto old_key = SecretBox::parse(k1, "secrets.key");
  ASSERT_TRUE(old_key.ok());
  Plane before;
  ASSERT_TRUE(before.broker.register_machine({"h0", "dc1", "r0", "a", {4000, 8192}}, 0).ok());
  ASSERT_TRUE(before.broker.health("h0", "ok", 0).ok());
  auto e = before.broker.entitlements().create({"web", 1, "", ""});
  ASSERT_TRUE(e.ok());
  JobSpec j;
  j.name = "site";
  j.entitlement = "web";
  j.entitlement_id = *e;
  j.per_task = {100, 64};
  j.task = {{"argv", {"/bin/sleep", "infinity"}},
            {"env", {{"STRIPE_KEY", "sk_live_hunter2"}}},
            {"image", "registry.example/app@sha256:" + std::string(64, 'a')},
            {"files", {{{"path", "/run/token"}, {"content", "t0ken-s3cret"}}}}};
  auto created = before.sched.create(j, 0);
  ASSERT_TRUE(created.ok()) << created.error().str();
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    (*st)->set_secrets(*old_key);
    persist_all(before, **st);
    auto raw = (*st)->load();
    ASSERT_TRUE(raw.ok()) << raw.error().str();
    ASSERT_EQ(raw->jobs.size(), 1u);
    std::string row = raw->jobs[0].spec.dump();
    EXPECT_EQ(row.find("hunter2"), std::string::npos) << row;
    EXPECT_EQ(row.find("s3cret"), std::string::npos) << row;
    EXPECT_NE(row.find("weft-sealed:v1:k1:"), std::string::npos) << row;
  }
  // Restored with the key: the plain values, and nothing to reseal.
  {
    Plane after;
    auto st = open();
    ASSERT_TRUE(st.ok());
    (*st)->set_secrets(*old_key);
    ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
    auto job = after.sched.job("site");
    ASSERT_TRUE(job);
    EXPECT_EQ(job->task["env"]["STRIPE_KEY"], "sk_live_hunter2");
    EXPECT_EQ(job->task["files"][0]["content"], "t0ken-s3cret");
    EXPECT_FALSE((*st)->secrets_stale());
  }
  // Without the key: the start stops, naming the job and field, never the value.
  {
    Plane after;
    auto st = open();
    ASSERT_TRUE(st.ok());
    auto r = (*st)->restore(after.alloc, after.broker, after.sched, 5);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().str().find("site/task.env.STRIPE_KEY"), std::string::npos)
        << r.error().str();
    EXPECT_EQ(r.error().str().find("hunter2"), std::string::npos);
  }
  // Rotated (a new key first, the old one kept): it opens, and asks to be rewritten.
  {
    Plane after;
    auto st = open();
    ASSERT_TRUE(st.ok());
    auto both = SecretBox::parse(k2 + k1, "secrets.key");
    ASSERT_TRUE(both.ok());
    (*st)->set_secrets(*both);
    ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
    EXPECT_TRUE((*st)->secrets_stale());
    EXPECT_EQ(after.sched.job("site")->task["env"]["STRIPE_KEY"], "sk_live_hunter2");
  }
}

TEST_P(Stores, RestartRestoresEverything) {
  Plane before;
  Result<std::vector<Command>> c = std::vector<Command>{};
  make_site(before, 4, 3, {1500, 1024}, &c);
  if (HasFatalFailure()) return;
  for (size_t i = 1; i < c->size(); ++i)
    before.sched.report((*c)[i].machine, {{(*c)[i].task_id, TaskState::kRunning}}, 1);
  // The first start was refused: its message, and that it waits for an update, survive.
  before.sched.start_refused((*c)[0].task_id, "user: no such user", true, 1);
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    persist_all(before, **st);
  }

  Plane after;
  auto st = open();
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
  ASSERT_EQ(after.sched.tasks().size(), before.sched.tasks().size());
  for (const auto& [id, t] : before.sched.tasks()) {
    const TaskRecord& r = after.sched.tasks().at(id);
    EXPECT_EQ(r.machine, t.machine);
    EXPECT_EQ(r.state, t.state);
    EXPECT_EQ(r.index, t.index);
  }
  for (MachineId m = 0; m < before.alloc.machine_count(); ++m) {
    EXPECT_EQ(after.alloc.free(m), before.alloc.free(m)) << m;
    EXPECT_EQ(after.alloc.entitlement_of(m), before.alloc.entitlement_of(m));
    EXPECT_EQ(after.broker.persisted(m).drained, before.broker.persisted(m).drained);
  }
  EXPECT_EQ(after.alloc.placement("site"), before.alloc.placement("site"));
  EXPECT_EQ(after.sched.tasks().at((*c)[0].task_id).message, "user: no such user");
  EXPECT_TRUE(after.sched.tasks().at((*c)[0].task_id).held);
  EXPECT_EQ(after.sched.replacement().waiting_for_budget(), 0u) << "a refused spec is not replaced";
  // Unavailability events survive too (issue 12), once each: the drain of h3.
  ASSERT_EQ(after.broker.unavailability().all().size(), 1u);
  EXPECT_EQ(after.broker.unavailability().all()[0].machine, "h3");
  EXPECT_EQ(after.broker.unavailability().all()[0].kind, "drain");
  EXPECT_EQ(after.broker.entitlements().named("web"), before.broker.entitlements().named("web"));
  EXPECT_EQ(after.sched.generation("site"), 1u);
  // Machines are unknown until they report again: nothing is placed on them meanwhile.
  EXPECT_FALSE(after.broker.usable(0));
  // An unchanged request is answered from the restored placement, and a replacement
  // gets a fresh task id (the sequence was restored).
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(after.broker.health("h" + std::to_string(i), "ok", 6).ok());
  MachineId victim = after.sched.tasks().at((*c)[1].task_id).machine;
  after.alloc.set_usable(victim, false, true);
  auto r = after.sched.replacement().machine_down(victim, 7);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(before.sched.tasks().count(r[0].task_id));
}

TEST(StateStore, StoredJobRowsOldAndNew) {
  using nlohmann::json;
  auto names = [](EntitlementId id) { return id == 2 ? std::string("batch") : std::string(); };
  // Today's row: the protocol form plus the entitlement's id.
  JobSpec s;
  s.name = "ok";
  s.entitlement = "batch";
  s.entitlement_id = 2;
  s.count = 4;
  s.per_task = {250, 64};
  s.task = {{"argv", {"true"}}};
  auto back = stored_job_spec(job_spec_to_json(s), names);
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->entitlement_id, 2u);
  EXPECT_EQ(back->entitlement, "batch");
  EXPECT_EQ(back->per_task, s.per_task);
  EXPECT_EQ(back->task, s.task);
  // A row of the previous version: the entitlement by id, a name too long for today's
  // rule and a task field the agent never knew. Kept as stored, so that the operator
  // can still update or stop the job.
  json old{{"name", std::string(40, 'x')},
           {"entitlement", 2},
           {"count", 2},
           {"per_task", {{"cpu_milli", 100}, {"mem_mb", 10}}},
           {"machine_type", ""},
           {"max_unavailable", 1},
           {"task", {{"argv", {"true"}}, {"limits", {{"memory", "1G"}}}}}};
  auto legacy = stored_job_spec(old, names);
  ASSERT_TRUE(legacy.ok()) << legacy.error().str();
  EXPECT_EQ(legacy->name, std::string(40, 'x'));
  EXPECT_EQ(legacy->entitlement, "batch");
  EXPECT_EQ(legacy->entitlement_id, 2u);
  EXPECT_EQ(legacy->count, 2);
  EXPECT_FALSE(stored_job_spec(json::array(), names).ok());
}

// The host rebooted (monotonic clock back near zero) or the wall clock stepped: a task
// that was starting a moment before the restart is still starting after it, not lost
// at once (finding 5), and no age underflows.
TEST_P(Stores, TaskAgesSurviveARebootAndAClockStep) {
  constexpr uint64_t kSecond = 1'000'000;
  Plane before;
  ASSERT_TRUE(before.broker.register_machine({"h0", "dc1", "r0", "a", {4000, 8192}}, 0).ok());
  ASSERT_TRUE(before.broker.health("h0", "ok", 0).ok());
  auto e = before.broker.entitlements().create({"web", 1, "", ""});
  ASSERT_TRUE(e.ok());
  JobSpec j;
  j.name = "site";
  j.entitlement = "web";
  j.entitlement_id = *e;
  j.per_task = {500, 256};
  j.task = {{"argv", {"/bin/true"}}};
  // Started at monotonic 1,000,000 s (a machine up for 11 days), wall 1.7e9 s.
  uint64_t mono = 1'000'000 * kSecond, wall = 1'700'000'000 * kSecond;
  ASSERT_TRUE(before.sched.create(j, mono).ok());
  {
    auto st = open();
    ASSERT_TRUE(st.ok());
    (*st)->set_clocks([&] { return mono + 2 * kSecond; }, [&] { return wall + 2 * kSecond; });
    persist_all(before, **st);
  }
  auto restored_since = [&](uint64_t now_mono, uint64_t now_wall) {
    Plane after;
    auto st = open();
    EXPECT_TRUE(st.ok());
    (*st)->set_clocks([=] { return now_mono; }, [=] { return now_wall; });
    EXPECT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, now_mono).ok());
    EXPECT_EQ(after.sched.tasks().size(), 1u);
    return after.sched.tasks().begin()->second.since_us;
  };
  // Rebooted: monotonic 30 s, wall 10 s after the write (12 s after the start).
  EXPECT_EQ(restored_since(30 * kSecond, wall + 12 * kSecond), 18 * kSecond);
  // Rebooted 5 s ago, task started 12 s ago: its age is kept, its time clamps at 0.
  EXPECT_EQ(restored_since(5 * kSecond, wall + 12 * kSecond), 0u);
  // The wall clock stepped back an hour: age 0, never negative.
  EXPECT_EQ(restored_since(40 * kSecond, wall - 3600 * kSecond), 40 * kSecond);
  // And the scheduler sees the task as recently started: not lost at the next report.
  Plane after;
  auto st = open();
  ASSERT_TRUE(st.ok());
  (*st)->set_clocks([] { return 30 * kSecond; }, [&] { return wall + 12 * kSecond; });
  ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 30 * kSecond).ok());
  ASSERT_TRUE(after.broker.health("h0", "ok", 30 * kSecond).ok());
  auto cmds = after.sched.report(0, {}, 31 * kSecond);
  EXPECT_EQ(after.sched.tasks().begin()->second.state, TaskState::kStarting);
}

TEST_P(Stores, AGroupCommitUndoesOneFailedWriteAndKeepsTheOthers) {
  {
    auto st = open();
    ASSERT_TRUE(st.ok());
    ASSERT_TRUE((*st)->open_batch().ok());
    ASSERT_TRUE((*st)->in_batch());
    // Three calls' writes in one batch, each as the daemon makes them: the second one
    // fails half-way and is undone alone.
    for (int call = 0; call < 3; ++call) {
      ASSERT_TRUE((*st)->begin().ok());
      ASSERT_TRUE((*st)
                      ->put_entitlement(static_cast<EntitlementId>(10 + call),
                                        {"ent" + std::to_string(call), 1, "", "", {}})
                      .ok());
      if (call == 1) {
        (*st)->rollback();
        continue;
      }
      ASSERT_TRUE((*st)->commit().ok());
    }
    ASSERT_TRUE((*st)->commit_batch().ok());
    EXPECT_FALSE((*st)->in_batch());
  }
  Plane after;
  auto st = open();
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
  EXPECT_TRUE(after.broker.entitlements().named("ent0"));
  EXPECT_FALSE(after.broker.entitlements().named("ent1"));
  EXPECT_TRUE(after.broker.entitlements().named("ent2"));
}

TEST_P(Stores, AnUncommittedBatchIsLostWhole) {
  {
    auto st = open();
    ASSERT_TRUE(st.ok());
    ASSERT_TRUE((*st)->open_batch().ok());
    ASSERT_TRUE((*st)->begin().ok());
    ASSERT_TRUE((*st)->put_entitlement(10, {"lost", 1, "", "", {}}).ok());
    ASSERT_TRUE((*st)->commit().ok());  // a savepoint released, not a commit
  }  // the process ends before commit_batch (a crash): nothing of the batch is kept
  Plane after;
  auto st = open();
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
  EXPECT_FALSE(after.broker.entitlements().named("lost"));
}

// A group that etcd cannot take as one transaction (more operations than
// --max-txn-ops, a key written twice, a put into a range deleted earlier in the group)
// is stored whole and in order; sqlite takes it as it comes.
TEST_P(Stores, LargeGroupsAndKeysWrittenTwiceEndAsWritten) {
  {
    auto st = open(8);
    ASSERT_TRUE(st.ok()) << st.error().str();
    ASSERT_TRUE((*st)->open_batch().ok());
    ASSERT_TRUE((*st)->begin().ok());
    for (int i = 0; i < 30; ++i)
      ASSERT_TRUE((*st)
                      ->put_entitlement(static_cast<EntitlementId>(i + 1),
                                        {"e" + std::to_string(i), 1, "", "", {}})
                      .ok());
    ASSERT_TRUE((*st)->put_entitlement(3, {"renamed", 2, "", "", {}}).ok());  // twice
    TaskRecord t;
    t.id = "gone.0.1";
    t.job = "gone";
    t.state = TaskState::kRunning;
    ASSERT_TRUE((*st)->put_task(t).ok());
    ASSERT_TRUE((*st)->delete_job("gone").ok());  // deletes the task just written
    t.id = "gone.0.2";
    ASSERT_TRUE((*st)->put_task(t).ok());  // a put inside the range just deleted
    ASSERT_TRUE((*st)->put_task_seq(2).ok());
    ASSERT_TRUE((*st)->commit().ok());
    ASSERT_TRUE((*st)->commit_batch().ok());
  }
  auto st = open();
  ASSERT_TRUE(st.ok());
  auto rows = (*st)->load();
  ASSERT_TRUE(rows.ok()) << rows.error().str();
  ASSERT_EQ(rows->entitlements.size(), 30u);
  EXPECT_EQ(rows->entitlements[2].second.value("name", ""), "renamed");
  ASSERT_EQ(rows->tasks.size(), 1u);
  EXPECT_EQ(rows->tasks[0].record.id, "gone.0.2");
  EXPECT_EQ(rows->task_seq, std::optional<uint64_t>(2));
}

// Task rows in a group: a write undone leaves the rows as they were (the etcd store keeps
// a job's tasks 64 indexes to a key, so an undone write must not leak into a bucket
// written later in the group), and forgotten tasks are gone.
TEST_P(Stores, TaskRowsFollowUndoneWritesAndForgottenTasks) {
  auto task = [](const std::string& id, int index, TaskState st) {
    TaskRecord t;
    t.id = id;
    t.job = "web";
    t.index = index;
    t.state = st;
    return t;
  };
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    ASSERT_TRUE((*st)->open_batch().ok());
    ASSERT_TRUE((*st)->begin().ok());
    ASSERT_TRUE((*st)->put_task(task("web.0.1", 0, TaskState::kRunning)).ok());
    ASSERT_TRUE((*st)->put_task(task("web.100.2", 100, TaskState::kRunning)).ok());
    ASSERT_TRUE((*st)->commit().ok());
    ASSERT_TRUE((*st)->begin().ok());  // a write that fails half-way
    ASSERT_TRUE((*st)->put_task(task("web.1.3", 1, TaskState::kStarting)).ok());
    ASSERT_TRUE((*st)->put_task(task("web.0.1", 0, TaskState::kFailed)).ok());
    (*st)->rollback();
    ASSERT_TRUE((*st)->delete_tasks({"web.100.2"}).ok());
    ASSERT_TRUE((*st)->begin().ok());
    ASSERT_TRUE((*st)->put_task(task("web.2.4", 2, TaskState::kStarting)).ok());
    ASSERT_TRUE((*st)->commit().ok());
    ASSERT_TRUE((*st)->commit_batch().ok());
  }
  auto st = open();
  ASSERT_TRUE(st.ok());
  auto rows = (*st)->load();
  ASSERT_TRUE(rows.ok()) << rows.error().str();
  std::map<std::string, TaskState> got;
  for (const auto& t : rows->tasks) got[t.record.id] = t.record.state;
  EXPECT_EQ(got, (std::map<std::string, TaskState>{{"web.0.1", TaskState::kRunning},
                                                   {"web.2.4", TaskState::kStarting}}));
}

// The features' notes (store/notes.h): put, replaced, erased, undone with a write that
// failed, read back whole by the next open; a guest's task taken back is stored so.
TEST_P(Stores, NotesAndATaskTakenBackAreKept) {
  using nlohmann::json;
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    ASSERT_TRUE((*st)->open_batch().ok());
    ASSERT_TRUE((*st)->begin().ok());
    ASSERT_TRUE((*st)->put_note("job-events/web/00000000000000000001", json::array({1})).ok());
    ASSERT_TRUE((*st)->put_note("rebalance/3", json{{"made", json::array()}}).ok());
    ASSERT_TRUE((*st)->put_note("autoscale/web", json{{"v", 1}}).ok());
    TaskRecord t;
    t.id = "guest.0.1";
    t.job = "guest";
    t.state = TaskState::kStopping;
    t.preempted = true;
    ASSERT_TRUE((*st)->put_task(t).ok());
    ASSERT_TRUE((*st)->commit().ok());
    ASSERT_TRUE((*st)->begin().ok());  // a write that fails: none of it stays
    ASSERT_TRUE((*st)->put_note("autoscale/web", json{{"v", 2}}).ok());
    ASSERT_TRUE((*st)->delete_note("rebalance/3").ok());
    (*st)->rollback();
    ASSERT_TRUE((*st)->begin().ok());
    ASSERT_TRUE((*st)->put_note("autoscale/web", json{{"v", 3}}).ok());
    ASSERT_TRUE((*st)->delete_note("job-events/web/00000000000000000001").ok());
    ASSERT_TRUE((*st)->commit().ok());
    ASSERT_TRUE((*st)->commit_batch().ok());
  }
  auto st = open();
  ASSERT_TRUE(st.ok());
  auto notes = (*st)->notes();
  ASSERT_TRUE(notes.ok()) << notes.error().str();
  EXPECT_EQ(*notes, (std::map<std::string, json>{{"autoscale/web", json{{"v", 3}}},
                                                 {"rebalance/3", json{{"made", json::array()}}}}));
  auto rows = (*st)->load();
  ASSERT_TRUE(rows.ok()) << rows.error().str();
  ASSERT_EQ(rows->tasks.size(), 1u) << "the notes are not rows of the state";
  EXPECT_TRUE(rows->tasks[0].record.preempted);
}

// A guest (an opportunistic batch job) whose room its machine's owner took back is still
// taken back after a restart: its task stops with its notice, holding no room (the
// owner's task has it), and one that finishes within its notice is done, not run again.
TEST_P(Stores, AGuestTakenBackIsStillTakenBackAfterARestart) {
  Plane before;
  ASSERT_TRUE(before.broker.register_machine({"h0", "dc1", "r0", "a", {4000, 8192}}, 0).ok());
  ASSERT_TRUE(before.broker.health("h0", "ok", 0).ok());
  auto web = before.broker.entitlements().create({"web", 1, "", ""});
  auto batch = before.broker.entitlements().create({"batch", 1, "", ""});
  ASSERT_TRUE(web.ok() && batch.ok());
  JobSpec guest;
  guest.name = "crunch";
  guest.kind = weft::JobKind::kBatch;
  guest.entitlement = "batch";
  guest.entitlement_id = *batch;
  guest.count = 2;
  guest.batch.completions = 2;
  guest.batch.opportunistic = true;
  guest.batch.notice_us = 30'000'000;
  guest.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  guest.per_task = {2000, 1024};
  guest.task = {{"argv", {"/bin/true"}}};
  ASSERT_TRUE(before.sched.create(guest, 0).ok());
  std::map<std::string, TaskState> running;
  for (const auto& t : before.sched.tasks().of_job("crunch")) running[t.id] = TaskState::kRunning;
  (void)before.sched.report(0, running, 1);
  JobSpec owner;
  owner.name = "site";
  owner.entitlement = "web";
  owner.entitlement_id = *web;
  owner.count = 1;
  owner.per_task = {2000, 1024};
  owner.task = {{"argv", {"/bin/sleep", "infinity"}}};
  ASSERT_TRUE(before.sched.create(owner, 2).ok());
  std::string taken;
  for (const auto& t : before.sched.tasks().of_job("crunch"))
    if (t.preempted) taken = t.id;
  ASSERT_FALSE(taken.empty()) << "the owner's task took a guest's room";
  const Resources free = before.alloc.free(0);
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    persist_all(before, **st);
  }
  auto st = open();
  ASSERT_TRUE(st.ok());
  Plane after;
  ASSERT_TRUE((*st)->restore(after.alloc, after.broker, after.sched, 5).ok());
  const TaskRecord& t = after.sched.tasks().at(taken);
  EXPECT_TRUE(t.preempted);
  EXPECT_EQ(t.state, TaskState::kStopping);
  EXPECT_EQ(after.alloc.free(0).cpu_milli, free.cpu_milli) << "it holds no room again";
  EXPECT_EQ(after.alloc.free(0).mem_mb, free.mem_mb);
  auto ops = after.sched.operations().pending_operations("crunch");
  ASSERT_EQ(ops.size(), 1u) << "its TaskController is still told why";
  EXPECT_EQ(ops[0].kind, "preempt");
  // It finished within its notice: a completion, not a task to run again.
  std::map<std::string, TaskState> seen{{taken, TaskState::kExited}};
  for (const auto& [id, r] : after.sched.tasks())
    if (id != taken && r.job == "crunch") seen[id] = TaskState::kRunning;
  (void)after.sched.report(t.machine, seen, 6);
  EXPECT_EQ(after.sched.tasks().at(taken).state, TaskState::kExited);
  EXPECT_EQ(after.sched.batch().progress("crunch")->succeeded, 1);
}

// Only keys a feature makes are notes' keys: nothing that escapes a prefix or a table.
TEST(Notes, KeysAreNamesAndTakenByPrefix) {
  using nlohmann::json;
  for (const char* good : {"job-events/web/00000000000000000001", "rebalance/3", "a.b_c-d"})
    EXPECT_TRUE(Notes::valid_key(good)) << good;
  for (const char* bad : {"", "/a", "a/", "a//b", "../x", "a/../b", "a b", "a\nb", "caf\xc3\xa9"})
    EXPECT_FALSE(Notes::valid_key(bad)) << bad;
  EXPECT_FALSE(Notes::valid_key(std::string(Notes::kMaxKey + 1, 'a')));
  Notes n;
  n.set_loaded({{"autoscale/a", 1}, {"autoscale-history/a", 2}, {"rebalance/1", 3}});
  auto a = n.take_loaded("autoscale/");
  EXPECT_EQ(a, (std::map<std::string, json>{{"autoscale/a", 1}}));
  EXPECT_TRUE(n.take_loaded("autoscale/").empty()) << "taken once";
  EXPECT_EQ(n.take_loaded("rebalance/").size(), 1u);
  n.put("x", 1);
  n.erase("x");
  auto pending = n.take();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_FALSE(pending["x"].has_value()) << "the latest wins: erased";
  EXPECT_FALSE(n.pending());
}

TEST_P(Stores, MaintenanceAndAuditAreKept) {
  {
    auto st = open();
    ASSERT_TRUE(st.ok()) << st.error().str();
    MaintenanceEvent e;
    e.id = 7;
    e.target_kind = "machine";
    e.target = "h1";
    e.start_us = 1'700'000'000'000'000;
    e.duration_us = 60'000'000;
    e.notice_us = 30'000'000;
    e.reason = "bios";
    e.machines = {"h1"};
    ASSERT_TRUE((*st)->put_maintenance(e).ok());
    e.id = 8;
    ASSERT_TRUE((*st)->put_maintenance(e).ok());
    ASSERT_TRUE((*st)->delete_maintenance(7).ok());
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE((*st)
                      ->put_audit({0, 1000 + i, "uid 0", "admin", "job.create",
                                   "j" + std::to_string(i), "d", "ok"})
                      .ok());
  }
  auto st = open();
  ASSERT_TRUE(st.ok());
  auto m = (*st)->maintenance();
  ASSERT_TRUE(m.ok()) << m.error().str();
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].id, 8u);
  EXPECT_EQ((*m)[0].reason, "bios");
  auto a = (*st)->audit(1002, 2);  // the latest two at or after 1002, oldest first
  ASSERT_TRUE(a.ok()) << a.error().str();
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].target, "j3");
  EXPECT_EQ((*a)[1].target, "j4");
  EXPECT_LT((*a)[0].seq, (*a)[1].seq);
}

// A leader whose etcd stops answering is lost by TTL minus the margin after its last
// keepalive that succeeded, even while its thread waits on a keepalive that etcd will
// never answer: never past the earliest moment etcd may expire the lease (the safety
// argument of docs/replicas.md). Deterministic: once the clock read before asking is
// past that bound, lost() must say so.
TEST(Leadership, IsLostByItsDeadlineEvenWhileAKeepaliveWaitsOnEtcd) {
  weft::testing::EtcdServer server;
  ASSERT_EQ(server.error(), "");
  LeaderConfig cfg;
  cfg.etcd = server.client_config(2000);
  cfg.key = "/deadline/leader";
  cfg.identity = "me";
  cfg.ttl_s = 2;
  auto l = Leadership::start(cfg);
  ASSERT_TRUE(l.ok()) << l.error().str();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(*l)->leading() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE((*l)->leading());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // keepalives succeed
  ASSERT_TRUE((*l)->leading());
  pid_t etcd = server.pid();
  ASSERT_GT(etcd, 0);
  uint64_t stopped = now_monotonic_us();
  ASSERT_EQ(::kill(etcd, SIGSTOP), 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{etcd};
  const uint64_t bound = 2'000'000 - 333'333;  // TTL minus the margin (TTL/6)
  bool seen_past_bound = false;
  while (now_monotonic_us() - stopped < 5'000'000) {
    uint64_t t = now_monotonic_us();
    bool lost = (*l)->lost();
    if (t - stopped >= bound) {
      EXPECT_TRUE(lost) << "still leading " << (t - stopped) / 1000 << " ms after etcd stopped";
      seen_past_bound = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(seen_past_bound);
  EXPECT_FALSE((*l)->leading());
  EXPECT_NE((*l)->lost_reason().find("no keepalive"), std::string::npos) << (*l)->lost_reason();
}

// Fencing: once the leader key this store was fenced on is gone (its lease expired, a
// new leader holds a new key), a write changes nothing and says so, and every later
// write is refused without reaching etcd.
TEST(EtcdStore, AWriteAfterLeadershipMovedChangesNothing) {
  weft::testing::EtcdServer server;
  ASSERT_EQ(server.error(), "");
  EtcdStoreConfig c;
  c.etcd.endpoints = {server.endpoint()};
  // The fencing is under test, not etcd's latency: a first write under a loaded suite
  // (the sanitizer pass) may take longer than the default 2 s.
  c.etcd.timeout_ms = 20000;
  c.prefix = "/fence/";
  auto st = EtcdStore::open(c);
  ASSERT_TRUE(st.ok()) << st.error().str();
  auto client = etcd::Client::create(c.etcd);
  ASSERT_TRUE(client.ok());
  auto won = (*client)->txn({{etcd::Compare::Target::kCreate, "/fence/leader", 0, {}}},
                            {{etcd::Op::Kind::kPut, "/fence/leader", "me", {}, 0}});
  ASSERT_TRUE(won.ok() && won->succeeded);
  (*st)->fence("/fence/leader", won->revision);
  ASSERT_TRUE((*st)->put_entitlement(1, {"before", 1, "", "", {}}).ok());
  // Leadership moves: the key is deleted and made again by another process.
  ASSERT_TRUE((*client)->txn({}, {{etcd::Op::Kind::kDelete, "/fence/leader", {}, {}, 0}}).ok());
  ASSERT_TRUE((*client)->txn({}, {{etcd::Op::Kind::kPut, "/fence/leader", "other", {}, 0}}).ok());
  ASSERT_TRUE((*st)->open_batch().ok());
  ASSERT_TRUE((*st)->put_entitlement(2, {"after", 1, "", "", {}}).ok());
  EXPECT_FALSE((*st)->commit_batch().ok());
  EXPECT_TRUE((*st)->fenced_out());
  EXPECT_FALSE((*st)->put_entitlement(3, {"later", 1, "", "", {}}).ok());
  auto rows = (*st)->load();
  ASSERT_TRUE(rows.ok()) << rows.error().str();
  ASSERT_EQ(rows->entitlements.size(), 1u);
  EXPECT_EQ(rows->entitlements[0].second.value("name", ""), "before");
}

// weft-controlplane migrate: a sqlite state copied into etcd restores the same.
TEST(EtcdStore, ASqliteStateMigratesWhole) {
  weft::testing::EtcdServer server;
  ASSERT_EQ(server.error(), "");
  TempDir tmp;
  Plane before;
  Result<std::vector<Command>> created = std::vector<Command>{};
  make_site(before, 3, 2, {500, 256}, &created);
  if (HasFatalFailure()) return;
  auto sq = StateStore::open(tmp.path + "/cp.db");
  ASSERT_TRUE(sq.ok());
  persist_all(before, **sq);
  ASSERT_TRUE((*sq)->put_audit({0, 0, "uid 0", "admin", "job.create", "site", "d", "ok"}).ok());
  ASSERT_TRUE((*sq)->put_note("rebalance/1", nlohmann::json{{"outcome", "paused"}}).ok());
  EtcdStoreConfig c;
  c.etcd.endpoints = {server.endpoint()};
  auto et = EtcdStore::open(c);
  ASSERT_TRUE(et.ok());
  ASSERT_TRUE((*et)->empty().value_or(false));
  auto copied = copy_state(**sq, **et);
  ASSERT_TRUE(copied.ok()) << copied.error().str();
  EXPECT_FALSE((*et)->empty().value_or(true));
  Plane after;
  ASSERT_TRUE((*et)->restore(after.alloc, after.broker, after.sched, 5).ok());
  ASSERT_EQ(after.sched.tasks().size(), 2u);
  for (const auto& [id, t] : before.sched.tasks()) {
    ASSERT_TRUE(after.sched.tasks().count(id)) << id;
    EXPECT_EQ(after.sched.tasks().at(id).machine, t.machine);
  }
  EXPECT_EQ(after.alloc.placement("site"), before.alloc.placement("site"));
  EXPECT_TRUE(after.broker.persisted(2).drained);
  EXPECT_EQ(after.sched.task_seq(), before.sched.task_seq());
  using nlohmann::json;
  auto notes = (*et)->notes();
  ASSERT_TRUE(notes.ok()) << notes.error().str();
  EXPECT_EQ(*notes, (std::map<std::string, json>{{"rebalance/1", json{{"outcome", "paused"}}}}));
  auto audit = (*et)->audit(0, 10);
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ(audit->size(), 1u);
  EXPECT_EQ(audit->front().target, "site");
}

}  // namespace
}  // namespace weft::cp
