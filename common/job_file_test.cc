// Job files: what an operator writes becomes job.create params; every mistake is named
// with its line.
#include "common/job_file.h"
#include "common/job_spec.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(JobFile, FullFileBecomesParams) {
  auto j = parse_job_file(R"(name = "web"
entitlement = "frontend"
count = 6
max_unavailable = 2
machine_type = "T1"
[resources]
cpu = 0.5
memory = "256M"
[task]
argv = ["/usr/bin/web", "--port", "8080"]
env = { MODE = "prod" }
[task.resources]
pids_max = 100
memory_max = "512M"
)",
                          "web.toml");
  ASSERT_TRUE(j.ok()) << j.error().str();
  EXPECT_EQ((*j)["name"], "web");
  EXPECT_EQ((*j)["entitlement"], "frontend");
  EXPECT_EQ((*j)["count"], 6);
  EXPECT_EQ((*j)["max_unavailable"], 2);
  EXPECT_EQ((*j)["machine_type"], "T1");
  EXPECT_EQ((*j)["per_task"]["cpu_milli"], 500);
  EXPECT_EQ((*j)["per_task"]["mem_mb"], 256);
  EXPECT_EQ((*j)["task"]["argv"][2], "8080");
  EXPECT_EQ((*j)["task"]["env"]["MODE"], "prod");
  EXPECT_EQ((*j)["task"]["resources"]["pids_max"], 100);
}

TEST(JobFile, MillicoresAndDefaults) {
  auto j = parse_job_file(
      "name = \"a\"\nentitlement = \"e\"\n[resources]\ncpu = \"250m\"\n[task]\nargv = [\"x\"]\n",
      "a.toml");
  ASSERT_TRUE(j.ok()) << j.error().str();
  EXPECT_EQ((*j)["per_task"]["cpu_milli"], 250);
  EXPECT_EQ((*j)["per_task"]["mem_mb"], 0);
  EXPECT_FALSE(j->contains("count"));  // the control plane's default (1)
}

TEST(JobFile, AutoscaleTable) {
  auto j = parse_job_file(
      "name = \"web\"\nentitlement = \"e\"\ncount = 2\n[resources]\ncpu = \"500m\"\n"
      "[autoscale]\nmin = 2\nmax = 8\ntarget = 0.6\nscale_down_window = \"2m\"\n"
      "[task]\nargv = [\"x\"]\n",
      "j.toml");
  ASSERT_TRUE(j.ok()) << j.error().str();
  EXPECT_EQ((*j)["autoscale"]["max"], 8);
  auto bad = parse_job_file(
      "name = \"web\"\nentitlement = \"e\"\n[resources]\ncpu = 1\n"
      "[autoscale]\nmin = 1\nmax = 8\ntarget = -1\n[task]\nargv = [\"x\"]\n",
      "j.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("j.toml:8"), std::string::npos) << bad.error().str();
}

TEST(JobFile, ErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"name = \"a b\"\nentitlement = \"e\"\n[task]\nargv=[\"x\"]\n", "j.toml:1"},
      {"entitlement = \"e\"\n[task]\nargv=[\"x\"]\n", "'name' must be 1-32"},
      {"name = \"a\"\n[task]\nargv=[\"x\"]\n", "'entitlement' is required"},
      {"name = \"a\"\nentitlement = \"e\"\ncount = -1\n[task]\nargv=[\"x\"]\n", "j.toml:3"},
      {"name = \"a\"\nentitlement = \"e\"\ncuont = 1\n[task]\nargv=[\"x\"]\n", "cuont"},
      {"name = \"a\"\nentitlement = \"e\"\n[resources]\ncpu = \"lots\"\n[task]\nargv=[\"x\"]\n",
       "j.toml:4"},
      {"name = \"a\"\nentitlement = \"e\"\n[resources]\nmemory = \"big\"\n[task]\nargv=[\"x\"]\n",
       "resources.memory"},
      {"name = \"a\"\nentitlement = \"e\"\n[resources]\ngpu = 1\n[task]\nargv=[\"x\"]\n", "gpu"},
      {"name = \"a\"\nentitlement = \"e\"\n", "'task' is required"},
      // What the agent would refuse is refused here, at its line (the example of an
      // older docs/jobs.md: `limits` is not a task field).
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nargv = [\"x\"]\nlimits = { pids = 1 }\n",
       "j.toml:5: 'task.limits' unknown field"},
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nargv = [\"x\"]\n[task.resources]\n"
       "memory_max = \"lots\"\n",
       "j.toml:6: 'task.resources.memory_max'"},
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nargv = [\"x\", \"\"]\ncwd = \"rel\"\n",
       "j.toml:5"},
      {"name = \"a\"\nentitlement = \"e\"\ncount = 0\n[task]\nargv = [\"x\"]\n", "j.toml:3"},
      {"name = \"abcdefghijklmnopqrstuvwxyz0123456\"\nentitlement = \"e\"\n[task]\nargv = "
       "[\"x\"]\n",
       "j.toml:1"},
      {"name = \"a\"\nentitlement = \"e\"\nplacement = \"heap\"\n[task]\nargv = [\"x\"]\n",
       "j.toml:3"},
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nargv = []\n", "j.toml:4"},
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nargv = [1]\n", "task.argv"},
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nname = \"x\"\nargv = [\"x\"]\n", "task.name"},
      {"name = \"a\"\nentitlement = \"e\"\n[task]\nowner = \"x\"\nargv = [\"x\"]\n", "task.owner"},
      {"name = \"a\"\nentitlement = = \"e\"\n", "j.toml"},
  };
  for (const auto& c : cases) {
    auto j = parse_job_file(c.text, "j.toml");
    ASSERT_FALSE(j.ok()) << c.text;
    EXPECT_NE(j.error().str().find(c.expect), std::string::npos)
        << c.text << "\n-> " << j.error().str();
  }
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

// Issue 48: opportunistic batch jobs and their notice.
TEST(JobFile, OpportunisticBatchJobs) {
  const std::string head = "name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n";
  auto j = parse_job_file(head +
                              "[batch]\ncompletions = 4\nopportunistic = true\n"
                              "notice = \"45s\"\n[task]\nargv = [\"/bin/true\"]\n",
                          "o.toml");
  ASSERT_TRUE(j.ok()) << j.error().str();
  auto spec = parse_job_spec(*j);
  ASSERT_TRUE(spec.ok()) << spec.error().str();
  EXPECT_TRUE(spec->batch.opportunistic);
  EXPECT_EQ(spec->batch.notice_us, 45ull * 1'000'000);
  auto back = parse_job_spec(to_json(*spec));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(to_json(*back), to_json(*spec));
  auto plain =
      parse_job_file(head + "[batch]\nopportunistic = true\n[task]\nargv = [\"x\"]\n", "o.toml");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(parse_job_spec(*plain)->batch.notice_us, 30ull * 1'000'000);  // the default
  struct Case {
    std::string text;
    const char* expect;
  } cases[] = {
      {head + "[batch]\nnotice = \"10s\"\n[task]\nargv=[\"x\"]\n",
       "o.toml:5: 'batch.notice' goes with batch.opportunistic = true"},
      {head + "[batch]\nopportunistic = true\nnotice = \"1h\"\n[task]\nargv=[\"x\"]\n",
       "o.toml:6: 'batch.notice' must be a duration from 1s to 10m"},
      {head + "[batch]\nopportunistic = true\nnotice = \"0s\"\n[task]\nargv=[\"x\"]\n",
       "'batch.notice' must be a duration from 1s to 10m"},
      {head + "[batch]\nopportunistic = \"yes\"\n[task]\nargv=[\"x\"]\n",
       "o.toml:5: 'batch.opportunistic' must be true or false"},
      {head + "[batch]\nopportunistic = true\n[ports]\nhttp = 8080\n[task]\nargv=[\"x\"]\n",
       "'ports.http' an opportunistic batch job's ports are picked"},
  };
  for (const auto& c : cases) {
    auto r = parse_job_file(c.text, "o.toml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.error().str().find(c.expect), std::string::npos)
        << c.text << "\n-> " << r.error().str();
  }
}

TEST(JobFile, BatchAndPeriodicTables) {
  auto j = parse_job_file(
      "name = \"report\"\nentitlement = \"e\"\nkind = \"batch\"\n"
      "[batch]\ncompletions = 10\nparallelism = 3\nmax_failures = 2\ndeadline = \"1h\"\n"
      "[periodic]\nschedule = \"0 3 * * *\"\noverlap = \"forbid\"\n"
      "[task]\nargv = [\"/bin/true\"]\n",
      "b.toml");
  ASSERT_TRUE(j.ok()) << j.error().str();
  auto spec = parse_job_spec(*j);
  ASSERT_TRUE(spec.ok()) << spec.error().str();
  EXPECT_TRUE(spec->is_batch());
  EXPECT_EQ(spec->count, 3);
  EXPECT_EQ(spec->batch.completions, 10);
  EXPECT_EQ(spec->batch.max_failures, 2);
  EXPECT_EQ(spec->batch.deadline_us, 3600ull * 1'000'000);
  ASSERT_TRUE(spec->periodic);
  EXPECT_EQ(spec->periodic->overlap, PeriodOverlap::kForbid);
  EXPECT_EQ(spec->periodic->max_running, kDefaultMaxRunning);
  // The protocol form gives the same spec back.
  auto back = parse_job_spec(to_json(*spec));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(to_json(*back), to_json(*spec));

  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"cron\"\n[task]\nargv=[\"x\"]\n",
       "b.toml:3: 'kind' must be"},
      {"name = \"a\"\nentitlement = \"e\"\n[batch]\ncompletions = 2\n[task]\nargv=[\"x\"]\n",
       "'batch' goes with kind = \"batch\""},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\ncount = 2\n[task]\nargv=[\"x\"]\n",
       "b.toml:4: 'count' a batch job runs batch.parallelism"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[batch]\ncompletions = 2\n"
       "parallelism = 3\n[task]\nargv=[\"x\"]\n",
       "b.toml:6: 'batch.parallelism' must be at most completions (2)"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[batch]\ndeadline = \"soon\"\n"
       "[task]\nargv=[\"x\"]\n",
       "b.toml:5: 'batch.deadline'"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\nschedule = \"61 * * * "
       "*\"\n"
       "[task]\nargv=[\"x\"]\n",
       "b.toml:5: 'periodic.schedule' minute: 61 is out of range"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\nschedule = \"@daily\"\n"
       "overlap = \"queue\"\n[task]\nargv=[\"x\"]\n",
       "b.toml:6: 'periodic.overlap'"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\nschedule = \"* * * * * "
       "*\"\n[task]\nargv=[\"x\"]\n",
       "b.toml:5: 'periodic.schedule' names times 1 s apart: periods must be at least 2 s"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\nschedule = \"0,1 3 * * "
       "* *\"\n[task]\nargv=[\"x\"]\n",
       "'periodic.schedule' names times 1 s apart"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\nschedule = \"@daily\"\n"
       "max_running = 0\n[task]\nargv=[\"x\"]\n",
       "b.toml:6: 'periodic.max_running' must be an integer from 1 to 100"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\nschedule = \"@daily\"\n"
       "max_running = 101\n[task]\nargv=[\"x\"]\n",
       "'periodic.max_running' must be an integer from 1 to 100"},
      {"name = \"a234567890123456789012\"\nentitlement = \"e\"\nkind = \"batch\"\n[periodic]\n"
       "schedule = \"@daily\"\n[task]\nargv=[\"x\"]\n",
       "b.toml:1: 'name' a periodic job's name has at most 21"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[resources]\ncpu = 1\n"
       "[autoscale]\nmin = 1\nmax = 2\n[task]\nargv=[\"x\"]\n",
       "'autoscale' a batch job's size"},
      {"name = \"a\"\nentitlement = \"e\"\nkind = \"batch\"\n[task]\nargv=[\"x\"]\n"
       "[task.restart]\npolicy = \"on-failure\"\n",
       "b.toml:7: 'task.restart.policy' a batch job's failed tasks are retried"},
  };
  for (const auto& c : cases) {
    auto r = parse_job_file(c.text, "b.toml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.error().str().find(c.expect), std::string::npos)
        << c.text << "\n  got: " << r.error().str();
  }
}

}  // namespace
}  // namespace weft
