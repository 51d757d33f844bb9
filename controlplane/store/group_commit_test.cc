#include "controlplane/store/group_commit.h"

#include <unistd.h>

#include <cerrno>

#include <gtest/gtest.h>

#include "common/clock.h"

namespace weft::cp {
namespace {

// A rewrite hook's work: the owner writes what is unsaved in a new group, as persist()
// does; false when no group can be opened.
bool write_unsaved_again(GroupCommit& group) {
  Written w = std::move(group.unsaved());
  group.unsaved() = {};
  if (!group.open().ok()) return false;
  group.wrote(w);
  return true;
}

// A store that commits or refuses as told, and counts.
struct FakeWrites : GroupWrites {
  bool open = false, refuse = false, fenced = false;
  int opened = 0, committed = 0, abandoned = 0;
  Status open_batch() override {
    open = true;
    ++opened;
    return {};
  }
  Status commit_batch() override {
    if (refuse || fenced) return make_error("refused");
    open = false;
    ++committed;
    return {};
  }
  bool in_batch() const override { return open; }
  void abandon_batch() override {
    open = false;
    ++abandoned;
  }
  bool fenced_out() const override { return fenced; }
  Status probe_write() override {
    if (refuse) return errno_error(ENOSPC, "sqlite: database or disk is full");
    return {};
  }
};

// A store that pipelines (as etcd's): each group sealed waits in `sent` until the test
// answers it.
struct FakeAsyncWrites : FakeWrites {
  std::vector<std::function<void(Status)>> sent;
  std::vector<int> sizes;
  bool async_commits() const override { return true; }
  void commit_batch_async(EventLoop&, std::function<void(Status)> done) override {
    open = false;
    sent.push_back(std::move(done));
  }
  void drain() override {
    auto all = std::exchange(sent, {});
    for (auto& d : all) d(Status{});
  }
};

struct GroupCommitTest : ::testing::Test {
  std::unique_ptr<EventLoop> loop = EventLoop::create().value();
  FakeWrites store;
  rpc::OutputGate gate;
  int rewrites = 0, commits_seen = 0;
  bool ended_hold = false;
  std::string deposed;
  std::unique_ptr<GroupCommit> group;

  void make(bool replicated, uint64_t max_age_us = 20'000, uint64_t retry_us = 30'000) {
    GroupCommit::Hooks hooks;
    hooks.rewrite = [this] {
      ++rewrites;
      return write_unsaved_again(*group);
    };
    hooks.deposed = [this](const std::string& why) { deposed = why; };
    hooks.committed = [this](uint64_t, bool ended) {
      ++commits_seen;
      ended_hold = ended;
    };
    group = std::make_unique<GroupCommit>(*loop, store, gate,
                                          GroupCommit::Options{replicated, max_age_us, retry_us},
                                          std::move(hooks));
  }
  // Runs the loop until `done` or 2 s pass.
  void run_until(const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) ASSERT_TRUE(loop->run_once(1000).ok());
    ASSERT_TRUE(done());
  }
  Written task(const std::string& id) {
    Written w;
    w.tasks.insert(id);
    return w;
  }
};

TEST_F(GroupCommitTest, WritesOfOneIterationCommitTogetherAndOnlyThenIsOutputSent) {
  make(false);
  ASSERT_TRUE(group->open().ok());
  ASSERT_TRUE(group->open().ok());  // joins the open group
  group->wrote(task("a"));
  group->wrote(task("b"));
  EXPECT_EQ(store.opened, 1);
  EXPECT_TRUE(gate.held());  // nothing is said before it is written
  run_until([&] { return store.committed == 1; });
  EXPECT_FALSE(gate.held());
  EXPECT_EQ(commits_seen, 1);
  EXPECT_EQ(group->seconds().count(), 1u);
  EXPECT_TRUE(group->unsaved().empty());
}

TEST_F(GroupCommitTest, ALocalDiskThatRefusesKeepsEverythingAndLetsRepliesGo) {
  make(false);
  group->unsaved().tasks.insert("waiting");
  Written first = task("a");
  first.events.push_back(Unavailability{});
  ASSERT_TRUE(group->open().ok());
  group->wrote(first);
  store.refuse = true;
  group->commit();
  EXPECT_EQ(store.abandoned, 1);
  EXPECT_EQ(group->failures(), 1u);
  EXPECT_FALSE(gate.held());  // answered from memory
  EXPECT_FALSE(group->held());
  // What the group covered is written again, with what waited already.
  EXPECT_EQ(group->unsaved().tasks, (std::unordered_set<std::string>{"a", "waiting"}));
  EXPECT_EQ(group->unsaved().events.size(), 1u);
  store.refuse = false;
  run_until([&] { return store.committed == 1; });  // the retry
  EXPECT_EQ(rewrites, 1);
  EXPECT_TRUE(group->unsaved().empty());
}

// An operator's change asks first: the open group commits, then the probe; a disk that
// takes nothing refuses the change before it is applied, and says so.
TEST_F(GroupCommitTest, AChangeIsRefusedBeforeItIsAppliedWhileTheDiskTakesNoWrites) {
  make(false);
  ASSERT_TRUE(group->open().ok());
  group->wrote(task("a"));
  ASSERT_TRUE(group->ready_for_change().ok());
  EXPECT_EQ(store.committed, 1);  // the open group first
  EXPECT_FALSE(group->failing());
  store.refuse = true;
  Status no = group->ready_for_change();
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.error().errnum, ENOSPC);
  EXPECT_NE(no.error().str().find("no change is accepted"), std::string::npos) << no.error().str();
  EXPECT_TRUE(group->failing());
  EXPECT_EQ(group->failures(), 1u);
  store.refuse = false;
  EXPECT_TRUE(group->ready_for_change().ok());
  ASSERT_TRUE(group->open().ok());
  group->wrote(task("b"));
  group->commit();
  EXPECT_FALSE(group->failing());  // a group that commits ends it
}

TEST_F(GroupCommitTest, AReplicatedStoreThatRefusesHoldsEveryReplyUntilAGroupCommits) {
  make(true);
  ASSERT_TRUE(group->open().ok());
  group->wrote(task("a"));
  store.refuse = true;
  group->commit();
  EXPECT_TRUE(gate.held());  // a command sent now might be unknown to the next leader
  EXPECT_TRUE(group->held());
  EXPECT_EQ(group->unsaved().tasks.count("a"), 1u);
  // Refused again at the first retry: still held, retried again.
  run_until([&] { return rewrites == 1; });
  EXPECT_TRUE(gate.held());
  store.refuse = false;
  run_until([&] { return store.committed == 1; });
  EXPECT_FALSE(gate.held());
  EXPECT_FALSE(group->held());
  EXPECT_TRUE(ended_hold);  // the machines' silence meanwhile was this process's stall
  EXPECT_GE(group->failures(), 2u);
}

TEST_F(GroupCommitTest, AFencedOutGroupIsNeverSentAndTheOwnerStepsDown) {
  make(true);
  ASSERT_TRUE(group->open().ok());
  group->wrote(task("a"));
  store.fenced = true;
  group->commit();
  EXPECT_FALSE(deposed.empty());
  EXPECT_TRUE(gate.held());
  EXPECT_EQ(store.abandoned, 1);
  EXPECT_EQ(rewrites, 0);
  EXPECT_EQ(group->failures(), 0u);
}

TEST_F(GroupCommitTest, SynchronousWritesOpenNoGroup) {
  make(false);
  group->set_sync(true);
  ASSERT_TRUE(group->open().ok());
  EXPECT_EQ(store.opened, 0);
  EXPECT_FALSE(gate.held());
  group->wrote(task("a"));  // its own transaction: nothing kept
  group->set_sync(false);
  ASSERT_TRUE(group->open().ok());
  EXPECT_EQ(store.opened, 1);
}

TEST_F(GroupCommitTest, AGroupPastItsAgeCommitsAtTheNextWriteUnderConstantLoad) {
  make(false, /*max_age_us=*/1);
  ASSERT_TRUE(group->open().ok());
  usleep(1000);
  group->wrote(task("a"));  // no loop iteration needed
  EXPECT_EQ(store.committed, 1);
  EXPECT_FALSE(gate.held());
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// One group in flight at a time: the next fills meanwhile and is sealed when the first
// has committed; a group etcd refused holds everything newer until the rewrite of its
// keys commits.
TEST(GroupCommitPipelined, TheNextGroupFillsWhileOneIsInFlightAndFailuresHoldWhatIsNewer) {
  auto loop = EventLoop::create().value();
  FakeAsyncWrites store;
  rpc::OutputGate gate;
  int rewrites = 0, commits = 0;
  std::unique_ptr<GroupCommit> group;
  GroupCommit::Hooks hooks;
  hooks.rewrite = [&] {
    ++rewrites;
    return write_unsaved_again(*group);
  };
  hooks.deposed = [](const std::string&) {};
  hooks.committed = [&](uint64_t, bool) { ++commits; };
  group = std::make_unique<GroupCommit>(*loop, store, gate,
                                        GroupCommit::Options{true, 20'000, 10'000}, hooks);
  auto spin = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) ASSERT_TRUE(loop->run_once(1000).ok());
    ASSERT_TRUE(done());
  };
  Written a, b, c;
  a.tasks.insert("a");
  b.tasks.insert("b");
  c.tasks.insert("c");
  ASSERT_TRUE(group->open().ok());
  group->wrote(a);
  spin([&] { return store.sent.size() == 1; });  // sealed at idle, sent off the loop
  EXPECT_EQ(group->in_flight(), 1u);
  EXPECT_TRUE(gate.held());
  uint64_t after_first = gate.epoch();
  EXPECT_EQ(after_first, 2u);       // the first group's output is epoch 1
  ASSERT_TRUE(group->open().ok());  // the next group opens while the first is in flight
  group->wrote(b);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(loop->run_once(1000).ok());
  EXPECT_EQ(store.sent.size(), 1u) << "a second group was sent before the first committed";
  // The first fails: its keys go back to what the next write covers; the second, sealed
  // now, commits but releases nothing (it does not carry the rewrite).
  auto first = std::move(store.sent[0]);
  store.sent.clear();
  first(make_error("etcd unavailable"));
  EXPECT_TRUE(group->held());
  EXPECT_EQ(group->unsaved().tasks.count("a"), 1u);
  spin([&] { return store.sent.size() == 1; });
  auto second = std::move(store.sent[0]);
  store.sent.clear();
  second(Status{});
  EXPECT_EQ(commits, 0);
  EXPECT_TRUE(gate.held());
  // The retry writes "a" again in a group of its own; once it commits, all is released.
  spin([&] { return store.sent.size() == 1; });
  EXPECT_EQ(rewrites, 1);
  auto third = std::move(store.sent[0]);
  store.sent.clear();
  third(Status{});
  EXPECT_EQ(commits, 1);
  EXPECT_FALSE(group->held());
  EXPECT_FALSE(gate.held());
  EXPECT_TRUE(group->unsaved().empty());
  // commit() waits for what is in flight (drain) before it returns.
  ASSERT_TRUE(group->open().ok());
  group->wrote(c);
  group->commit();
  EXPECT_EQ(group->in_flight(), 0u);
  EXPECT_FALSE(gate.held());
}

// What Manager::check_machines excuses: while a group etcd has not answered holds the
// replies, how long the oldest has waited (from its group's opening, not its sending),
// through the next group filling meanwhile; nothing once all is released.
TEST(GroupCommitPipelined, TheOldestHeldOutputIsTimedUntilItsGroupCommits) {
  auto loop = EventLoop::create().value();
  FakeAsyncWrites store;
  rpc::OutputGate gate;
  GroupCommit::Hooks hooks;
  hooks.rewrite = [] { return true; };
  hooks.deposed = [](const std::string&) {};
  hooks.committed = [](uint64_t, bool) {};
  GroupCommit group(*loop, store, gate, GroupCommit::Options{true, 20'000, 10'000}, hooks);
  auto spin = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) ASSERT_TRUE(loop->run_once(1000).ok());
    ASSERT_TRUE(done());
  };
  EXPECT_EQ(group.waiting_since_us(), 0u);
  uint64_t before = now_monotonic_us();
  ASSERT_TRUE(group.open().ok());
  Written a, b;
  a.tasks.insert("a");
  b.tasks.insert("b");
  group.wrote(a);
  uint64_t opened = group.waiting_since_us();
  EXPECT_GE(opened, before);
  EXPECT_LE(opened, now_monotonic_us());
  spin([&] { return store.sent.size() == 1; });  // in flight: etcd does not answer
  usleep(30'000);
  ASSERT_TRUE(group.open().ok());  // a newer group fills meanwhile
  group.wrote(b);
  EXPECT_EQ(group.waiting_since_us(), opened) << "the group in flight is the oldest";
  EXPECT_GE(now_monotonic_us() - group.waiting_since_us(), 30'000u);
  auto first = std::move(store.sent[0]);
  store.sent.clear();
  first(Status{});  // the first commits: the newer group's output is the oldest waiting
  EXPECT_GT(group.waiting_since_us(), opened);
  spin([&] { return store.sent.size() == 1; });
  auto second = std::move(store.sent[0]);
  store.sent.clear();
  second(Status{});
  EXPECT_FALSE(gate.held());
  EXPECT_EQ(group.waiting_since_us(), 0u);
}

}  // namespace
}  // namespace weft::cp
