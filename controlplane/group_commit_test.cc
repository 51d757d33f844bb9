#include "controlplane/group_commit.h"

#include <gtest/gtest.h>

namespace weft::cp {
namespace {

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
      // The owner writes what is unsaved in a new group, as persist() does.
      Written w = std::move(group->unsaved());
      group->unsaved() = {};
      if (!group->open().ok()) return false;
      group->wrote(w);
      return true;
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
