// Batch and periodic jobs in the scheduler (scheduler_batch.cc) and the periodic clock
// (periodic.h), on plain structs: completions, parallelism, the failure budget, the
// deadline, the job's end, progress kept across a restart, periods run once.
#include <gtest/gtest.h>

#include <map>

#include "common/cron.h"
#include "controlplane/jobs/periodic.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/scheduling/scheduler_fixture.h"

namespace weft::cp {
namespace {

constexpr uint64_t kSecond = 1'000'000;
constexpr int64_t kWall = 1795824000;  // 2026-11-28T00:00:00Z

class Batch : public SchedulerFixture {
 protected:
  Batch() : SchedulerFixture(4, SchedulerLimits{600, 100}) {}
  JobSpec batch(const std::string& name, int completions, int parallelism, int max_failures) {
    JobSpec s;
    s.name = name;
    s.kind = weft::JobKind::kBatch;
    s.count = parallelism;
    s.batch.completions = completions;
    s.batch.max_failures = max_failures;
    s.per_task = {1000, 1024};
    s.task = {{"argv", {"/bin/true"}}};
    return s;
  }
  // What the machines run: the starts sent and not stopped.
  void apply(const std::vector<Command>& cmds) {
    for (const auto& c : cmds) {
      if (c.kind == Command::Kind::kStart) on_[c.task_id] = c.machine;
      if (c.kind == Command::Kind::kStop) on_.erase(c.task_id);
    }
  }
  // Every task running ends as `end` says; the machines report it. The commands sent.
  template <class F>
  std::vector<Command> end_all(uint64_t now, F end) {
    std::map<MachineId, std::map<std::string, TaskState>> reports;
    for (const auto& [id, m] : on_) reports[m][id] = end(id);
    on_.clear();
    std::vector<Command> out;
    for (MachineId m : ids_) {
      auto r = sched_.report(m, reports[m], now);
      out.insert(out.end(), r.begin(), r.end());
    }
    apply(out);
    return out;
  }
  int live(const std::string& job) {
    int n = 0;
    for (const auto& t : sched_.tasks().of_job(job))
      n += t.state == TaskState::kStarting || t.state == TaskState::kRunning ||
           t.state == TaskState::kPending;
    return n;
  }
  // Periodic job "p" (one /bin/true a run) made with its periods counted after kWall.
  // The spec, for an update.
  JobSpec create_periodic(const std::string& schedule, weft::PeriodOverlap overlap,
                          int max_running = weft::kDefaultMaxRunning) {
    JobSpec s = batch("p", 1, 1, 0);
    s.periodic = weft::PeriodicSpec{schedule, overlap, max_running};
    EXPECT_TRUE(sched_.create(s, 0).ok());
    sched_.batch().skip_period("p", kWall, "");
    return s;
  }
  std::map<std::string, MachineId> on_;
};

// Issue 48: an opportunistic batch job runs on room another entitlement does not use,
// not counted against anything; when that entitlement's job needs the room it is taken
// back at once: the guest is told to stop within its notice, and runs again elsewhere
// once there is room, without counting as a failure.
TEST_F(Batch, AnOpportunisticJobRunsOnIdleRoomAndIsTakenBackWithItsNotice) {
  JobSpec guest = batch("crunch", 100, 8, 0);
  guest.entitlement_id = 2;  // an entitlement without machines of its own
  guest.per_task = {2000, 1024};
  guest.batch.opportunistic = true;
  guest.batch.notice_us = 30 * kSecond;
  guest.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  auto started = sched_.create(guest, 0);
  ASSERT_TRUE(started.ok()) << started.error().str();
  apply(*started);
  ASSERT_EQ(live("crunch"), 8);            // every machine of entitlement 1 full of guests
  EXPECT_EQ(alloc_.pool(2).machines, 0u);  // nothing joined the guest's entitlement
  for (MachineId m : ids_) EXPECT_EQ(alloc_.free(m).cpu_milli, 0);

  // The owner's job takes back one guest's room; its own task starts at once.
  JobSpec web;
  web.name = "web";
  web.entitlement_id = 1;
  web.count = 1;
  web.per_task = {1000, 512};
  web.task = {{"argv", {"/bin/sleep", "600"}}};
  auto made = sched_.create(web, kSecond);
  ASSERT_TRUE(made.ok()) << made.error().str();
  int starts = 0;
  std::vector<Command> stops;
  for (const auto& c : *made) {
    starts += c.kind == Command::Kind::kStart;
    if (c.kind == Command::Kind::kStop) stops.push_back(c);
  }
  EXPECT_EQ(starts, 1);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].spec.value("grace", 0.0), 30.0);  // its notice
  const std::string taken = stops[0].task_id;
  EXPECT_EQ(sched_.tasks().at(taken).state, TaskState::kStopping);
  EXPECT_TRUE(sched_.tasks().at(taken).preempted);
  const MachineId m = stops[0].machine;
  // Its TaskController is told (preempt: an operation it cannot hold back; an
  // acknowledgement changes nothing).
  auto ops = sched_.operations().pending_operations("crunch");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].id, "preempt/" + taken);
  EXPECT_EQ(ops[0].kind, "preempt");
  EXPECT_TRUE(sched_.operations().grant("crunch", {ops[0].id}, kSecond).empty());
  EXPECT_EQ(alloc_.free(m).cpu_milli, 1000);  // the owner's task holds the rest
  apply(*made);

  // The guest left: not a failure, and no room for it now: it waits.
  auto r = sched_.report(m, {{taken, TaskState::kStopped}}, 2 * kSecond);
  apply(r);
  EXPECT_EQ(sched_.batch().progress("crunch")->failed, 0);
  EXPECT_EQ(live("crunch"), 7);
  // The owner's job goes: the guest runs again, on the room it left.
  apply(*sched_.stop("web", 3 * kSecond));
  for (const auto& t : sched_.tasks().of_job("web"))
    apply(sched_.report(t.machine, {{t.id, TaskState::kStopped}}, 4 * kSecond));
  apply(sched_.tick(5 * kSecond));
  EXPECT_EQ(live("crunch"), 8);
  EXPECT_EQ(sched_.batch().progress("crunch")->failed, 0);
}

TEST_F(Batch, TenCompletionsAtParallelismThreeWithOneFailureRetried) {
  auto c = sched_.create(batch("b", 10, 3, 2), 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->size(), 3u);
  apply(*c);
  int exited = 0, failed = 0, most = 0;
  bool failed_once = false;
  for (uint64_t round = 1; round < 20 && !on_.empty(); ++round) {
    most = std::max(most, static_cast<int>(on_.size()));
    end_all(round * kSecond, [&](const std::string&) {
      if (!failed_once) {
        failed_once = true;
        ++failed;
        return TaskState::kFailed;
      }
      ++exited;
      return TaskState::kExited;
    });
    EXPECT_LE(live("b"), 3);
  }
  auto p = sched_.batch().progress("b");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->outcome, "succeeded");
  EXPECT_EQ(p->succeeded, 10);
  EXPECT_EQ(p->failed, 1);
  EXPECT_EQ(exited, 10);  // no task beyond the completions started
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(most, 3);
  EXPECT_TRUE(on_.empty());
  // Its slots went back; it stays listed until stopped, and then goes.
  EXPECT_FALSE(alloc_.request("b").has_value());
  EXPECT_TRUE(sched_.job("b").has_value());
  EXPECT_FALSE(sched_.scale("b", 2, 30 * kSecond).ok());
  EXPECT_TRUE(sched_.tick(31 * kSecond).empty());
  ASSERT_TRUE(sched_.stop("b", 32 * kSecond).ok());
  EXPECT_FALSE(sched_.job("b").has_value());
  // The end is one of its events.
  bool ended = false;
  for (const auto& e : sched_.take_events())
    ended |= e.job == "b" && e.task.empty() && e.what == "succeeded";
  EXPECT_TRUE(ended);
}

TEST_F(Batch, PastItsFailureBudgetTheJobFailsAndStopsTheRest) {
  auto c = sched_.create(batch("b", 4, 2, 1), 0);
  ASSERT_TRUE(c.ok());
  apply(*c);
  // Both fail: 2 failures > max_failures 1.
  auto out = end_all(kSecond, [](const std::string&) { return TaskState::kFailed; });
  auto p = sched_.batch().progress("b");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->outcome, "failed");
  EXPECT_EQ(p->failed, 2);
  EXPECT_NE(p->reason.find("more than max_failures (1)"), std::string::npos) << p->reason;
  // The first machine's report replaced its failed task (within the budget then); the
  // second's failed the job, which stopped that replacement.
  EXPECT_TRUE(on_.empty());
  EXPECT_EQ(live("b"), 0);
  EXPECT_TRUE(sched_.tick(10 * kSecond).empty());
  EXPECT_FALSE(alloc_.request("b").has_value());
}

TEST_F(Batch, AFailureWithinTheBudgetIsRetriedAndTheRunningOnesStopWhenItFails) {
  auto c = sched_.create(batch("b", 4, 2, 1), 0);
  ASSERT_TRUE(c.ok());
  apply(*c);
  std::string first = (*c)[0].task_id;
  // One fails, the other keeps running: the failed one is replaced.
  MachineId m = on_.at(first);
  on_.erase(first);
  auto r = sched_.report(m, {{first, TaskState::kFailed}}, kSecond);
  apply(r);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].kind, Command::Kind::kStart);
  EXPECT_EQ(live("b"), 2);
  // The replacement fails too: the job fails, and its other task is stopped.
  std::string second = r[0].task_id;
  m = on_.at(second);
  on_.erase(second);
  auto stop = sched_.report(m, {{second, TaskState::kFailed}}, 2 * kSecond);
  apply(stop);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(stop[0].kind, Command::Kind::kStop);
  EXPECT_EQ(sched_.batch().progress("b")->outcome, "failed");
  // Its slots go back once the stopped task is gone.
  EXPECT_TRUE(alloc_.request("b").has_value());
  auto gone = end_all(3 * kSecond, [](const std::string&) { return TaskState::kStopped; });
  (void)gone;
  for (MachineId mm : ids_) sched_.report(mm, {}, 4 * kSecond);
  EXPECT_FALSE(alloc_.request("b").has_value());
}

TEST_F(Batch, PastItsDeadlineTheJobFails) {
  JobSpec s = batch("b", 2, 1, 3);
  s.batch.deadline_us = 10 * kSecond;
  auto c = sched_.create(s, 0);
  ASSERT_TRUE(c.ok());
  apply(*c);
  EXPECT_TRUE(sched_.tick(9 * kSecond).empty());
  auto out = sched_.tick(11 * kSecond);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Command::Kind::kStop);
  auto p = sched_.batch().progress("b");
  EXPECT_EQ(p->outcome, "failed");
  EXPECT_NE(p->reason.find("deadline"), std::string::npos) << p->reason;
}

TEST_F(Batch, ProgressIsKeptAcrossARestartAndTheRestRuns) {
  auto c = sched_.create(batch("b", 5, 2, 3), 0);
  ASSERT_TRUE(c.ok());
  apply(*c);
  end_all(kSecond, [](const std::string&) { return TaskState::kExited; });  // 2 done, 2 more start
  auto stored = sched_.handover().persisted_job("b");
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->progress.succeeded, 2);
  // Its stored form and back.
  auto wall = [](uint64_t mono) { return static_cast<int64_t>(mono) + 1000; };
  auto mono = [](int64_t w) { return static_cast<uint64_t>(w - 1000); };
  JobProgress back = progress_from_json(progress_json(stored->progress, wall), mono);
  EXPECT_EQ(back, stored->progress);
  EXPECT_EQ(
      progress_from_json(
          nlohmann::json{
              {"succeeded", "x"}, {"outcome", "weird"}, {"parent", "../x"}, {"started", -1.5}},
          mono),
      JobProgress{});
  // A new scheduler with the job and its ended tasks only (the running two were lost
  // with the machines that ran them, say): the tick starts what is still needed.
  Allocator alloc2;
  for (int d = 0; d < 4; ++d)
    alloc2.add_machine(
        {"m" + std::to_string(d), "dc1", "rack" + std::to_string(d), "a", {4000, 8192}});
  for (MachineId m : ids_) ASSERT_TRUE(alloc2.assign(m, 1).ok());
  Scheduler again{alloc2};
  JobSpec s = stored->spec;
  ASSERT_TRUE(alloc2.restore(*alloc_.request("b"), alloc_.placement("b"), {}).ok());
  again.handover().restore_job(*stored);
  for (const auto& t : sched_.tasks().of_job("b"))
    if (t.state == TaskState::kExited) again.handover().restore_task(t);
  again.handover().finish_restore();
  auto started = again.tick(2 * kSecond);
  EXPECT_EQ(started.size(), 2u);  // 3 completions still needed, parallelism 2
  EXPECT_EQ(again.batch().progress("b")->succeeded, 2);
}

TEST_F(Batch, APeriodicJobsRunsAreJobsOfTheirOwnOncePerPeriod) {
  JobSpec s = batch("nightly", 1, 1, 0);
  s.periodic = weft::PeriodicSpec{"*/5 * * * * *", weft::PeriodOverlap::kAllow};
  auto c = sched_.create(s, 0);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());  // a template: nothing placed
  EXPECT_FALSE(alloc_.request("nightly").has_value());
  PeriodicRuns periodic;
  // The first look marks now: the first run is at the next period.
  EXPECT_TRUE(periodic.tick(sched_, kWall + 1, kSecond).empty());
  EXPECT_EQ(sched_.batch().progress("nightly")->last_period, kWall + 1);
  EXPECT_TRUE(periodic.tick(sched_, kWall + 4, kSecond).empty());
  auto run = periodic.tick(sched_, kWall + 5, 5 * kSecond);
  ASSERT_EQ(run.size(), 1u);
  std::string name = "nightly-" + std::to_string(kWall + 5);
  EXPECT_EQ(run[0].task_id.rfind(name + ".", 0), 0u) << run[0].task_id;
  EXPECT_EQ(sched_.batch().progress(name)->parent, "nightly");
  EXPECT_EQ(sched_.batch().progress("nightly")->last_period, kWall + 5);
  // The same period again: refused; the clock at the same second: nothing.
  EXPECT_FALSE(sched_.batch().start_period("nightly", kWall + 5, 6 * kSecond).ok());
  EXPECT_TRUE(periodic.tick(sched_, kWall + 6, 6 * kSecond).empty());
  // Its run ends; the next period runs beside nothing.
  apply(run);
  end_all(7 * kSecond, [](const std::string&) { return TaskState::kExited; });
  EXPECT_EQ(sched_.batch().progress(name)->outcome, "succeeded");
  auto next = periodic.tick(sched_, kWall + 10, 10 * kSecond);
  EXPECT_EQ(next.size(), 1u);
  apply(next);
  end_all(11 * kSecond, [](const std::string&) { return TaskState::kExited; });
  // Ten periods pass unseen (a control plane down for 50 s): each runs in turn.
  auto caught = periodic.tick(sched_, kWall + 60, 60 * kSecond);
  EXPECT_EQ(caught.size(), 10u);
  EXPECT_EQ(sched_.batch().progress("nightly")->last_period, kWall + 60);
  apply(caught);
  end_all(61 * kSecond, [](const std::string&) { return TaskState::kExited; });
  // History: the latest three that succeeded are kept, older ones forgotten.
  periodic.tick(sched_, kWall + 61, 62 * kSecond);
  EXPECT_EQ(sched_.batch().ended_runs("nightly").size(), 3u);
  // Stopping it stops its runs.
  auto more = periodic.tick(sched_, kWall + 65, 65 * kSecond);
  apply(more);
  ASSERT_EQ(sched_.batch().periodic_jobs().at("nightly").size(), 1u);
  auto stopped = sched_.stop("nightly", 66 * kSecond);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->size(), 1u);
  EXPECT_FALSE(sched_.job("nightly").has_value());
}

TEST_F(Batch, OverlapForbidSkipsAndReplaceStops) {
  JobSpec s = create_periodic("*/5 * * * * *", weft::PeriodOverlap::kForbid);
  PeriodicRuns periodic;
  auto first = periodic.tick(sched_, kWall + 5, kSecond);
  ASSERT_EQ(first.size(), 1u);
  // Still running at the next period: skipped, said in the events.
  EXPECT_TRUE(periodic.tick(sched_, kWall + 10, 2 * kSecond).empty());
  EXPECT_EQ(sched_.batch().progress("p")->last_period, kWall + 10);
  bool skipped = false;
  for (const auto& e : sched_.take_events()) skipped |= e.job == "p" && e.what == "period skipped";
  EXPECT_TRUE(skipped);
  // Replace: the running one is stopped and the new one starts.
  s.periodic->overlap = weft::PeriodOverlap::kReplace;
  ASSERT_TRUE(sched_.rollouts().update(s, 3 * kSecond).ok());
  auto replaced = periodic.tick(sched_, kWall + 15, 4 * kSecond);
  ASSERT_EQ(replaced.size(), 2u);
  EXPECT_EQ(replaced[0].kind, Command::Kind::kStop);
  EXPECT_EQ(replaced[1].kind, Command::Kind::kStart);
}

// Issue 61: a step of the wall clock. Forward, the periods it jumped over are not
// missed ones: only the latest runs (not kCatchUp of them), said in the events. Back, no
// period runs twice, and the schedule goes on once the clock passes the last one run.
TEST_F(Batch, AWallClockStepRunsNoPeriodTwiceAndNoBurst) {
  create_periodic("*/5 * * * * *", weft::PeriodOverlap::kAllow, 100);
  PeriodicRuns periodic;
  auto first = periodic.tick(sched_, kWall + 5, kSecond);
  ASSERT_EQ(first.size(), 1u);
  sched_.take_events();
  // An hour forward between two ticks (the clocks as the leader reads them each tick).
  const int64_t after = kWall + 6 + 3600;
  EXPECT_EQ(periodic.observe_clock(sched_, kSecond, static_cast<uint64_t>(kWall + 6) * kSecond), 0);
  EXPECT_EQ(periodic.observe_clock(sched_, kSecond, static_cast<uint64_t>(after) * kSecond),
            int64_t{3600} * 1'000'000);
  std::string why;
  for (const auto& e : sched_.take_events())
    if (e.job == "p" && e.what == "period skipped") why = e.detail;
  EXPECT_NE(why.find("stepped forward by 3600 s"), std::string::npos) << why;
  auto one = periodic.tick(sched_, after, 2 * kSecond);
  EXPECT_EQ(one.size(), 1u);  // the latest period only
  EXPECT_EQ(sched_.batch().progress("p")->last_period, kWall + 3605);
  // Back by the same hour: nothing runs again, whatever the ticks; and then on.
  for (int64_t t = kWall + 7; t <= kWall + 3605; t += 5)
    EXPECT_TRUE(periodic.tick(sched_, t, 3 * kSecond).empty()) << t - kWall;
  EXPECT_EQ(periodic.tick(sched_, kWall + 3610, 4 * kSecond).size(), 1u);
  // A step forward with no period in between changes nothing.
  periodic.clock_stepped(sched_, kWall + 3611, kWall + 3613);
  EXPECT_EQ(sched_.batch().progress("p")->last_period, kWall + 3610);
}

// Issue 59: a run a second that never ended started one run a second until its
// entitlement was full. With overlap "allow", at most max_running runs go at once.
TEST_F(Batch, APeriodBeyondMaxRunningRunsInFlightIsSkipped) {
  create_periodic("*/5 * * * * *", weft::PeriodOverlap::kAllow, 2);
  PeriodicRuns periodic;
  auto two = periodic.tick(sched_, kWall + 10, kSecond);  // two periods due: both run
  EXPECT_EQ(two.size(), 2u);
  apply(two);
  sched_.take_events();
  // A third while both still run: skipped, and said why.
  EXPECT_TRUE(periodic.tick(sched_, kWall + 15, 2 * kSecond).empty());
  EXPECT_EQ(sched_.batch().progress("p")->last_period, kWall + 15);
  EXPECT_FALSE(sched_.job("p-" + std::to_string(kWall + 15)).has_value());
  std::string why;
  for (const auto& e : sched_.take_events())
    if (e.job == "p" && e.what == "period skipped") why = e.detail;
  EXPECT_NE(why.find("max_running"), std::string::npos) << why;
  // One ends: the next period runs again.
  end_all(3 * kSecond, [](const std::string& id) {
    return id.rfind("p-" + std::to_string(kWall + 5), 0) == 0 ? TaskState::kExited
                                                              : TaskState::kRunning;
  });
  auto again = periodic.tick(sched_, kWall + 20, 4 * kSecond);
  EXPECT_EQ(again.size(), 1u);
  EXPECT_TRUE(sched_.job("p-" + std::to_string(kWall + 20)).has_value());
}

TEST_F(Batch, MoreThanTenMissedPeriodsSkipTheOldest) {
  create_periodic("* * * * * *", weft::PeriodOverlap::kAllow);
  PeriodicRuns periodic;
  auto runs = periodic.tick(sched_, kWall + 15, kSecond);
  EXPECT_EQ(runs.size(), 10u);
  EXPECT_TRUE(sched_.job("p-" + std::to_string(kWall + 6)).has_value());
  EXPECT_FALSE(sched_.job("p-" + std::to_string(kWall + 5)).has_value());
  EXPECT_EQ(sched_.batch().progress("p")->last_period, kWall + 15);
}

}  // namespace
}  // namespace weft::cp
