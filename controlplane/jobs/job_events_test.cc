// A job's events: numbered across jobs, the last kPerJob of each kept, paged by number.
#include "controlplane/jobs/job_events.h"

#include <gtest/gtest.h>

namespace weft::cp {
namespace {

TEST(JobEvents, PagedAndBoundedPerJob) {
  JobEvents ev;
  for (int i = 0; i < 10; ++i) {
    ev.record("web", {0, 1, "web.0." + std::to_string(i), "m1", "placed", ""});
    ev.record("db", {0, 1, "db.0." + std::to_string(i), "m2", "running", ""});
  }
  uint64_t next = 0;
  auto page = ev.list("web", 0, 4, &next);
  ASSERT_EQ(page.size(), 4u);
  EXPECT_EQ(page[0].task, "web.0.0");
  EXPECT_EQ(next, page[3].seq);
  auto rest = ev.list("web", next, 100, &next);
  ASSERT_EQ(rest.size(), 6u);
  EXPECT_EQ(rest[0].task, "web.0.4");
  EXPECT_GT(rest[0].seq, page[3].seq);
  uint64_t same = next;
  EXPECT_TRUE(ev.list("web", next, 100, &same).empty());
  EXPECT_EQ(same, next);  // nothing new: ask after the same number again
  EXPECT_TRUE(ev.list("nope", 0, 10, &next).empty());
  for (size_t i = 0; i < JobEvents::kPerJob + 50; ++i)
    ev.record("web", {0, 2, "web.1.1", "m1", "ready", ""});
  auto kept = ev.list("web", 0, 1000, &next);
  EXPECT_EQ(kept.size(), JobEvents::kPerJob);
  EXPECT_EQ(kept.front().what, "ready");  // the oldest went
  Notes notes;
  ev.keep_only([](const std::string& job) { return job == "db"; }, notes);
  EXPECT_TRUE(ev.list("web", 0, 10, &next).empty());
  EXPECT_EQ(ev.list("db", 0, 100, &next).size(), 10u);
  EXPECT_EQ(JobEvents::to_json(kept[0])["what"], "ready");
  EXPECT_FALSE(JobEvents::to_json(kept[0]).contains("detail"));
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

TEST(JobEvents, TheLatestOfEveryJobNewestFirst) {
  JobEvents ev;
  ev.record("a", {0, 1, "a.0.1", "m1", "placed", ""});
  ev.record("b", {0, 2, "b.0.1", "m2", "placed", ""});
  ev.record("a", {0, 3, "a.0.1", "m1", "running", ""});
  auto latest = ev.latest(2);
  ASSERT_EQ(latest.size(), 2u);
  EXPECT_EQ(latest[0]["job"], "a");
  EXPECT_EQ(latest[0]["what"], "running");
  EXPECT_EQ(latest[1]["job"], "b");
  EXPECT_EQ(ev.latest(10).size(), 3u);
  EXPECT_TRUE(JobEvents().latest(5).empty());
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// The store as the notes leave it: the latest value of each key.
void write(Notes& notes, std::map<std::string, nlohmann::json>* stored) {
  for (auto& [key, value] : notes.take())
    if (value)
      (*stored)[key] = *value;
    else
      stored->erase(key);
}

// A new leader reads the events back from the notes: the same events under the same
// numbers, numbering going on after them; the notes stay bounded (at most kMaxNotes a
// job, and none that holds only events past the kPerJob kept); a gone job's go.
TEST(JobEvents, ANewLeaderShowsTheSameEventsFromTheNotes) {
  JobEvents ev;
  Notes notes;
  std::map<std::string, nlohmann::json> stored;
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i <= round % 3; ++i)
      ev.record("web", {0, uint64_t(round), "web.0." + std::to_string(round), "m1", "running",
                        round % 2 ? "" : "why"});
    if (round % 5 == 0) ev.record("db", {0, 7, "db.0.1", "m2", "placed", ""});
    ev.save(notes);
    write(notes, &stored);
    size_t web_notes = 0;
    for (const auto& [key, value] : stored) web_notes += key.rfind("job-events/web/", 0) == 0;
    ASSERT_LE(web_notes, JobEvents::kMaxNotes) << "round " << round;
  }
  uint64_t next = 0;
  auto before = ev.list("web", 0, 1000, &next);
  ASSERT_EQ(before.size(), JobEvents::kPerJob);
  JobEvents again;
  stored["job-events/web/x"] = nlohmann::json::array();              // not a number
  stored["job-events/db/00000000000000000001"] = nlohmann::json(3);  // not a list
  again.restore(stored, notes);
  auto after = again.list("web", 0, 1000, &next);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].seq, before[i].seq);
    EXPECT_EQ(after[i].task, before[i].task);
    EXPECT_EQ(after[i].detail, before[i].detail);
    EXPECT_EQ(after[i].at_us, before[i].at_us);
  }
  EXPECT_EQ(again.list("db", 0, 1000, &next).size(), 40u);
  // Numbers go on: a follower of `job events --follow` keeps its place.
  again.record("web", {0, 9, "web.0.x", "m1", "stopped", ""});
  auto newest = again.list("web", before.back().seq, 10, &next);
  ASSERT_EQ(newest.size(), 1u);
  EXPECT_GT(newest[0].seq, before.back().seq);
  // Saved again from the restored state: still bounded, and a gone job's notes erased.
  again.save(notes);
  again.keep_only([](const std::string& job) { return job == "web"; }, notes);
  write(notes, &stored);
  for (const auto& [key, value] : stored)
    EXPECT_NE(key.rfind("job-events/db/0", 0), 0u) << key << " outlived its job";
  JobEvents third;
  third.restore(stored, notes);
  EXPECT_EQ(third.list("web", 0, 1000, &next).back().what, "stopped");
  EXPECT_TRUE(third.list("db", 0, 1000, &next).empty());
}

}  // namespace
}  // namespace weft::cp
