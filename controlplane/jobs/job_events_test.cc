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
  ev.keep_only([](const std::string& job) { return job == "db"; });
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
