// The scheduler's core on plain structs: placement to commands, reconciliation with
// machine reports, replacement of lost tasks without duplicates, the destructive-
// operation budget, rolling updates, scaling and stopping.
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/scheduling/scheduler_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace weft::cp {
namespace {

constexpr uint64_t kMin = 60'000'000;

class Sched : public SchedulerFixture {
 protected:
  Sched() : SchedulerFixture(6, SchedulerLimits{60, 2}) {}
  JobSpec spec(const std::string& name, int count) {
    JobSpec s;
    s.name = name;
    s.count = count;
    s.per_task = {1000, 1024};
    s.task = {{"argv", {"/bin/sleep", "infinity"}}};
    return s;
  }
  // An at-most-one job's spec; the machines' leases end when lease_end_ says.
  JobSpec at_most_one(const std::string& name, int count) {
    sched_.replacement().set_lease_end([this](MachineId m) { return lease_end_[m]; });
    JobSpec s = spec(name, count);
    s.copies = JobCopies::kAtMostOne;
    return s;
  }
  std::map<MachineId, uint64_t> lease_end_;
  // What machine m would report: every task the scheduler sent it and did not stop.
  std::map<std::string, TaskState> running_on(MachineId m, const std::vector<Command>& sent) {
    std::map<std::string, TaskState> r;
    for (const auto& c : sent)
      if (c.machine == m) {
        if (c.kind == Command::Kind::kStart)
          r[c.task_id] = TaskState::kReady;
        else
          r.erase(c.task_id);
      }
    return r;
  }
  // Job `s` created at 0, every machine reporting its tasks at 1: what was sent.
  std::vector<Command> create_running(const JobSpec& s) {
    auto c = sched_.create(s, 0);
    EXPECT_TRUE(c.ok()) << c.error().str();
    if (!c.ok()) return {};
    for (MachineId m : ids_) sched_.report(m, running_on(m, *c), 1);
    return *c;
  }
  // Every machine reports what it was sent (at `now`): the commands the reports caused.
  std::vector<Command> report_all(const std::vector<Command>& sent, uint64_t now) {
    std::vector<Command> next;
    for (MachineId m : ids_) {
      auto r = sched_.report(m, running_on(m, sent), now);
      next.insert(next.end(), r.begin(), r.end());
    }
    return next;
  }
  int count_kind(const std::vector<Command>& cmds, Command::Kind k) {
    int n = 0;
    for (const auto& c : cmds) n += c.kind == k;
    return n;
  }
  std::vector<TaskRecord> live(const std::string& job) {
    std::vector<TaskRecord> out;
    for (const auto& t : sched_.tasks().of_job(job))
      if (t.state == TaskState::kRunning || t.state == TaskState::kStarting) out.push_back(t);
    return out;
  }
};

TEST_F(Sched, CreatePlacesAndReportsMakeTasksRunning) {
  auto c = sched_.create(spec("web", 3), 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  ASSERT_EQ(c->size(), 3u);
  std::set<MachineId> machines;
  for (const auto& cmd : *c) {
    EXPECT_EQ(cmd.kind, Command::Kind::kStart);
    EXPECT_EQ(cmd.run_params()["name"], cmd.task_id);
    EXPECT_EQ(cmd.run_params()["argv"][0], "/bin/sleep");
    machines.insert(cmd.machine);
  }
  EXPECT_EQ(machines.size(), 3u);  // spread: one per rack
  for (MachineId m : machines) EXPECT_TRUE(sched_.report(m, running_on(m, *c), 1).empty());
  for (const auto& t : sched_.tasks().of_job("web")) EXPECT_EQ(t.state, TaskState::kRunning);
}

// An at-most-one job's lost task (docs/jobs.md, "At most one copy"): its replacement
// waits for the dead machine's lease, and the other jobs' do not.
TEST_F(Sched, AnAtMostOneTaskIsReplacedOnlyAfterItsMachinesLease) {
  JobSpec one = at_most_one("db", 1);
  auto c = sched_.create(one, 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ((*c)[0].run_params().value("at_most_one", false), true);  // the agent fences it
  MachineId dead = (*c)[0].machine;
  std::string old = (*c)[0].task_id;
  sched_.report(dead, running_on(dead, *c), 1);
  lease_end_[dead] = 100;
  alloc_.set_usable(dead, false, true);
  EXPECT_TRUE(sched_.replacement().machine_down(dead, 50).empty());
  EXPECT_EQ(sched_.replacement().waiting_for_lease(), 1u);
  EXPECT_FALSE(sched_.replacement().fenced_due(99));
  EXPECT_TRUE(sched_.tick(99).empty());  // the lease holds: nothing starts
  EXPECT_TRUE(sched_.replacement().fenced_due(100));
  auto r = sched_.tick(100);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].kind, Command::Kind::kStart);
  EXPECT_NE(r[0].machine, dead);
  EXPECT_EQ(sched_.replacement().waiting_for_lease(), 0u);
  EXPECT_EQ(sched_.tasks().at(old).state, TaskState::kLost);
}

TEST_F(Sched, AnAtMostOneTaskWhoseMachineSaysItEndedNeedNotWaitForTheLease) {
  JobSpec one = at_most_one("db", 1);
  auto c = sched_.create(one, 0);
  ASSERT_TRUE(c.ok());
  MachineId m = (*c)[0].machine;
  std::string old = (*c)[0].task_id;
  sched_.report(m, running_on(m, *c), 1);
  lease_end_[m] = 1'000;
  alloc_.set_usable(m, false, true);
  EXPECT_TRUE(sched_.replacement().machine_down(m, 10).empty());
  // Back (its lease renewed by what it says), still running the old copy: it is told to
  // stop it, and the replacement waits on.
  lease_end_[m] = 2'000;
  auto back = sched_.report(m, {{old, TaskState::kRunning}}, 20);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].kind, Command::Kind::kStop);
  EXPECT_TRUE(sched_.tick(30).empty());
  // The copy ended (fenced, or stopped): replaced at once, long before the lease's end.
  sched_.report(m, {{old, TaskState::kStopped}}, 40);
  EXPECT_TRUE(sched_.replacement().fenced_due(41));
  auto r = sched_.tick(41);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].kind, Command::Kind::kStart);
}

// Nothing else starts a fenced index either: a scale-up converges the job and starts
// the new index only.
TEST_F(Sched, AScaleUpDoesNotStartAnIndexFencedForItsLease) {
  JobSpec one = at_most_one("db", 1);
  std::vector<Command> sent = create_running(one);
  ASSERT_EQ(sent.size(), 1u);
  MachineId dead = sent[0].machine;
  lease_end_[dead] = 100;
  alloc_.set_usable(dead, false, true);
  EXPECT_TRUE(sched_.replacement().machine_down(dead, 50).empty());
  auto up = sched_.scale("db", 2, 60);
  ASSERT_TRUE(up.ok()) << up.error().str();
  ASSERT_EQ(up->size(), 1u);
  EXPECT_EQ((*up)[0].kind, Command::Kind::kStart);
  EXPECT_EQ(sched_.tasks().at((*up)[0].task_id).index, 1);
  auto r = sched_.tick(100);  // the lease ended: index 0 now
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(sched_.tasks().at(r[0].task_id).index, 0);
}

// A drain moves an at-most-one job's task break before make: it is stopped first, and
// its index starts elsewhere once its machine says it ended; a stop not confirmed (the
// machine lost meanwhile) holds the index until the machine's lease ends.
TEST_F(Sched, ADrainedAtMostOneTaskStopsBeforeItsIndexStartsElsewhere) {
  JobSpec one = at_most_one("db", 2);
  std::vector<Command> sent = create_running(one);
  ASSERT_EQ(sent.size(), 2u);
  MachineId drained = sent[0].machine, lost = sent[1].machine;
  const std::string a = sent[0].task_id, b = sent[1].task_id;
  alloc_.set_usable(drained, false, true);
  auto d = sched_.moves().machine_drain(drained, 2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, Command::Kind::kStop);
  EXPECT_EQ(d[0].task_id, a);
  EXPECT_EQ(sched_.tasks().at(a).state, TaskState::kStopping);
  EXPECT_TRUE(sched_.moves().moving(a));
  // Still running there: nothing starts.
  EXPECT_TRUE(sched_.report(drained, {{a, TaskState::kRunning}}, 3).empty());
  auto next = sched_.report(drained, {{a, TaskState::kStopped}}, 4);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].kind, Command::Kind::kStart);
  EXPECT_NE(next[0].machine, drained);
  EXPECT_EQ(sched_.tasks().at(next[0].task_id).index, sched_.tasks().at(a).index);

  // The other index's machine drained, then lost before its stop was confirmed.
  alloc_.set_usable(lost, false, true);
  auto d2 = sched_.moves().machine_drain(lost, 5);
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_EQ(d2[0].kind, Command::Kind::kStop);
  lease_end_[lost] = 100;
  EXPECT_TRUE(sched_.replacement().machine_down(lost, 6).empty());
  EXPECT_EQ(sched_.tasks().at(b).state, TaskState::kLost);
  EXPECT_EQ(sched_.replacement().waiting_for_lease(), 1u);
  EXPECT_TRUE(sched_.tick(99).empty());
  auto r = sched_.tick(100);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].kind, Command::Kind::kStart);
  EXPECT_EQ(sched_.tasks().at(r[0].task_id).index, sched_.tasks().at(b).index);
}

// The ReBalancer's move of an at-most-one job's task: stopped first, then started at the
// machine chosen.
TEST_F(Sched, AnAtMostOneRebalancingMoveStopsFirstThenStartsAtTheChosenMachine) {
  JobSpec one = at_most_one("db", 1);
  std::vector<Command> sent = create_running(one);
  ASSERT_EQ(sent.size(), 1u);
  const std::string moved = sent[0].task_id;
  const MachineId from = sent[0].machine;
  MachineId to = ids_[0] == from ? ids_[1] : ids_[0];
  auto r = sched_.moves().move_task(moved, to, "rebalance", 2);
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].kind, Command::Kind::kStop);
  EXPECT_EQ((*r)[0].machine, from);
  EXPECT_TRUE(sched_.moves().moving(moved));
  auto next = sched_.report(from, {{moved, TaskState::kStopped}}, 3);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].kind, Command::Kind::kStart);
  EXPECT_EQ(next[0].machine, to);
  EXPECT_FALSE(sched_.moves().moving(moved));
}

TEST_F(Sched, AJobWithATaskControllerIsAtMostOneUnlessItSaysAny) {
  nlohmann::json j = {{"name", "db"},
                      {"entitlement", "e"},
                      {"task_controller", {{"address", "10.0.0.1:7400"}}},
                      {"task", {{"argv", {"/bin/true"}}}}};
  auto s = parse_job_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_TRUE(s->at_most_one());
  j["copies"] = "any";
  EXPECT_FALSE(parse_job_spec(j)->at_most_one());
  j.erase("task_controller");
  j.erase("copies");
  EXPECT_FALSE(parse_job_spec(j)->at_most_one());
  j["copies"] = "at_most_one";
  EXPECT_TRUE(parse_job_spec(j)->at_most_one());
  EXPECT_EQ(to_json(*parse_job_spec(j))["copies"], "at_most_one");
  j["copies"] = "one";
  auto bad = parse_job_spec(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().field, "copies");
  j["copies"] = "any";
  j["task"]["at_most_one"] = true;  // the control plane's to set, not the job's
  bad = parse_job_spec(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().field, "task.at_most_one");
}

TEST_F(Sched, LostMachineIsReplacedAndNeverRunsTwice) {
  auto c = sched_.create(spec("web", 3), 0);
  ASSERT_TRUE(c.ok());
  for (MachineId m : ids_) sched_.report(m, running_on(m, *c), 1);
  MachineId dead = (*c)[0].machine;
  std::string lost_id = (*c)[0].task_id;
  alloc_.set_usable(dead, false, true);  // what the broker does first
  auto r = sched_.replacement().machine_down(dead, 2);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].kind, Command::Kind::kStart);
  EXPECT_NE(r[0].machine, dead);
  EXPECT_NE(r[0].task_id, lost_id);
  EXPECT_EQ(sched_.tasks().at(lost_id).state, TaskState::kLost);
  EXPECT_EQ(live("web").size(), 3u);
  // The machine comes back still running the old task: it is told to stop it.
  alloc_.set_usable(dead, true, true);
  auto back = sched_.report(dead, {{lost_id, TaskState::kReady}}, 3);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].kind, Command::Kind::kStop);
  EXPECT_EQ(back[0].task_id, lost_id);
  EXPECT_EQ(live("web").size(), 3u);
  // A task nobody knows about is stopped too.
  auto stray = sched_.report(dead, {{"other.0.99", TaskState::kReady}}, 4);
  ASSERT_EQ(stray.size(), 1u);
  EXPECT_EQ(stray[0].kind, Command::Kind::kStop);
}

TEST_F(Sched, MissingFromReportIsLostAndFailedIsReplaced) {
  auto c = sched_.create(spec("web", 2), 0);
  ASSERT_TRUE(c.ok());
  for (MachineId m : ids_) sched_.report(m, running_on(m, *c), 1);
  MachineId m0 = (*c)[0].machine;
  // The machine's report no longer has the task: lost, replaced.
  auto r = sched_.report(m0, {}, 2);
  EXPECT_EQ(count_kind(r, Command::Kind::kStart), 1);
  EXPECT_EQ(sched_.tasks().at((*c)[0].task_id).state, TaskState::kLost);
  // A task that exited on its own is replaced as well.
  MachineId m1 = (*c)[1].machine;
  auto f = sched_.report(m1, {{(*c)[1].task_id, TaskState::kFailed}}, 3);
  EXPECT_EQ(count_kind(f, Command::Kind::kStart), 1);
  EXPECT_EQ(sched_.tasks().at((*c)[1].task_id).state, TaskState::kFailed);
  // A start that never shows up is lost after the grace period, not before.
  MachineId m2 = f[0].machine;
  EXPECT_TRUE(sched_.report(m2, {}, 4).empty());
  auto late = sched_.report(m2, {}, 4 + 2 * kMin);
  EXPECT_EQ(count_kind(late, Command::Kind::kStart), 1);
}

// A whole report is merged with the machine's tasks in id order: a task it should run
// and lacks is lost, one it runs that is not ours is stopped, a readiness change is seen,
// and tasks as on record cost nothing, wherever they fall in the order.
TEST_F(Sched, AWholeReportIsMergedWithTheMachinesTasks) {
  auto c = sched_.create(spec("web", static_cast<int>(ids_.size()) * 3), 0);
  ASSERT_TRUE(c.ok());
  for (MachineId m : ids_) sched_.report(m, running_on(m, *c), 1);
  MachineId m = (*c)[0].machine;
  auto mine = running_on(m, *c);
  ASSERT_GE(mine.size(), 3u);
  auto it = mine.begin();
  std::string first = it->first, second = std::next(it)->first, last = mine.rbegin()->first;
  EXPECT_TRUE(sched_.report(m, mine, 2).empty()) << "as on record: nothing to do";
  auto report = mine;
  report.erase(second);                       // lacks one in the middle
  report[first] = TaskState::kRunning;        // not ready any more
  report["aaa.0.1"] = TaskState::kRunning;    // not ours, before every id of its own
  report["web.zzz.9"] = TaskState::kRunning;  // not ours, after them
  auto r = sched_.report(m, report, 3);
  std::set<std::string> stopped;
  for (const auto& cmd : r)
    if (cmd.kind == Command::Kind::kStop) stopped.insert(cmd.task_id);
  EXPECT_EQ(stopped, (std::set<std::string>{"aaa.0.1", "web.zzz.9"}));
  EXPECT_EQ(count_kind(r, Command::Kind::kStart), 1) << "the lost task's replacement";
  EXPECT_EQ(sched_.tasks().at(second).state, TaskState::kLost);
  EXPECT_EQ(sched_.tasks().at(first).state, TaskState::kRunning);
  EXPECT_FALSE(sched_.tasks().at(first).ready);
  EXPECT_TRUE(sched_.tasks().at(last).ready);
  EXPECT_EQ(sched_.tasks().at(last).state, TaskState::kRunning);
}

TEST_F(Sched, DestructiveOperationsAreRateLimited) {
  auto c = sched_.create(spec("web", 6), 0);  // one per machine
  ASSERT_TRUE(c.ok());
  for (MachineId m : ids_) sched_.report(m, running_on(m, *c), 1);
  // A whole "rack row" of 4 machines dies at once; the budget is a burst of 2, 1/s.
  std::vector<Command> all;
  for (int i = 0; i < 4; ++i) alloc_.set_usable(ids_[static_cast<size_t>(i)], false, true);
  for (int i = 0; i < 4; ++i) {
    auto r = sched_.replacement().machine_down(ids_[static_cast<size_t>(i)], 2);
    all.insert(all.end(), r.begin(), r.end());
  }
  EXPECT_EQ(count_kind(all, Command::Kind::kStart), 2);
  EXPECT_EQ(sched_.replacement().waiting_for_budget(), 2u);
  EXPECT_TRUE(sched_.tick(3).empty());      // no tokens yet
  auto later = sched_.tick(2 + 2'500'000);  // 2.5 s at 1/s: two more tokens
  EXPECT_EQ(count_kind(later, Command::Kind::kStart), 2);
  EXPECT_EQ(sched_.replacement().waiting_for_budget(), 0u);
  for (const auto& cmd : later) EXPECT_GE(cmd.machine, ids_[4]);  // the survivors
}

TEST_F(Sched, AnUpdateToANewImageWaitsForEachMachinesPrefetch) {
  using json = nlohmann::json;
  JobSpec s = spec("img", 4);
  s.max_unavailable = 4;
  s.task = {{"image", "r.example/app@sha256:" + std::string(64, 'a')}};
  std::vector<Command> sent = create_running(s);
  std::set<MachineId> hosts;
  for (const auto& t : live("img")) hosts.insert(t.machine);
  s.task["image"] = "r.example/app@sha256:" + std::string(64, 'b');
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok()) << u.error().str();
  // Every machine of the job is asked to fetch the new image; nothing stops yet.
  EXPECT_EQ(count_kind(*u, Command::Kind::kStop), 0);
  std::set<MachineId> asked;
  for (const auto& cmd : *u)
    if (cmd.kind == Command::Kind::kPrefetch) {
      asked.insert(cmd.machine);
      EXPECT_EQ(cmd.spec["fetch"], json({{"image", s.task["image"]}}));
      EXPECT_EQ(cmd.spec["generation"], 2);
    }
  EXPECT_EQ(asked, hosts);
  // One machine has it: its old tasks (and only they) stop.
  MachineId first = *hosts.begin();
  auto r = sched_.rollouts().prefetched("img", 2, first, 3);
  ASSERT_FALSE(r.empty());
  for (const auto& cmd : r) {
    EXPECT_EQ(cmd.kind, Command::Kind::kStop);
    EXPECT_EQ(cmd.machine, first);
  }
  EXPECT_TRUE(sched_.rollouts().prefetched("img", 2, first, 4).empty());  // answered once
  EXPECT_TRUE(
      sched_.rollouts().prefetched("img", 1, *hosts.rbegin(), 4).empty());  // an older update
  // The others are late: past the deadline the update rolls on without them.
  EXPECT_EQ(count_kind(sched_.tick(5), Command::Kind::kStop), 0);
  auto late = sched_.tick(2 + kPrefetchTimeoutUs);
  EXPECT_EQ(count_kind(late, Command::Kind::kStop), static_cast<int>(4 - r.size()));
  // The same image again (another argument): nothing to fetch.
  s.task["argv"] = {"/app", "--v2"};
  auto again = sched_.rollouts().update(s, 3 + kPrefetchTimeoutUs);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(count_kind(*again, Command::Kind::kPrefetch), 0);
}

TEST_F(Sched, AnUpdateToANewPackageFetchesOnlyThePackageFirst) {
  using json = nlohmann::json;
  JobSpec s = spec("pkg", 2);
  s.max_unavailable = 2;
  s.task = {{"image", "r.example/base@sha256:" + std::string(64, 'a')},
            {"argv", {"/opt/tool/bin/tool"}},
            {"package",
             {{"url", "https://pkgs.example/tool-1.tar"},
              {"sha256", std::string(64, 'c')},
              {"target", "/opt/tool"}}}};
  std::vector<Command> sent = create_running(s);
  std::set<MachineId> hosts;
  for (const auto& t : live("pkg")) hosts.insert(t.machine);
  s.task["package"]["url"] = "https://pkgs.example/tool-2.tar";
  s.task["package"]["sha256"] = std::string(64, 'd');
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok()) << u.error().str();
  std::set<MachineId> asked;
  for (const auto& cmd : *u)
    if (cmd.kind == Command::Kind::kPrefetch) {
      asked.insert(cmd.machine);
      EXPECT_EQ(cmd.spec["fetch"], json({{"package", s.task["package"]}}));  // not the image
    }
  EXPECT_EQ(asked, hosts);
  EXPECT_EQ(count_kind(*u, Command::Kind::kStop), 0);
}

TEST_F(Sched, RollingUpdateKeepsMaxUnavailable) {
  JobSpec s = spec("web", 4);
  s.max_unavailable = 1;
  std::vector<Command> sent = create_running(s);
  s.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok()) << u.error().str();
  EXPECT_EQ(sched_.generation("web"), 2u);
  ASSERT_EQ(u->size(), 1u);  // one at a time
  EXPECT_EQ((*u)[0].kind, Command::Kind::kStop);
  sent.insert(sent.end(), u->begin(), u->end());
  uint64_t now = 3;
  for (int step = 0; step < 20; ++step) {
    std::vector<Command> next;
    for (MachineId m : ids_) {
      auto r = sched_.report(m, running_on(m, sent), now++);
      next.insert(next.end(), r.begin(), r.end());
    }
    if (next.empty()) break;
    // Never more than one task of the job down: starts pair with the stop before them.
    EXPECT_LE(count_kind(next, Command::Kind::kStop), 1);
    for (const auto& cmd : next) {
      if (cmd.kind == Command::Kind::kStart) {
        EXPECT_EQ(cmd.run_params()["argv"][1], "1000");
      }
    }
    sent.insert(sent.end(), next.begin(), next.end());
  }
  auto l = live("web");
  ASSERT_EQ(l.size(), 4u);
  for (const auto& t : l) {
    EXPECT_EQ(t.generation, 2u);
    EXPECT_EQ(t.state, TaskState::kRunning);
  }
  JobSpec bigger = s;
  bigger.per_task.cpu_milli = 2000;
  EXPECT_EQ(sched_.rollouts().update(bigger, now).error().field, "resources");
}

// Readiness: a task that runs but is not ready is unavailable. A rolling update goes on
// only as new tasks become ready, and a task that stops being ready counts as down.
TEST_F(Sched, ARollingUpdateWaitsForTheNewTaskToBeReady) {
  JobSpec s = spec("web", 3);
  s.max_unavailable = 1;
  std::vector<Command> sent = create_running(s);
  s.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->size(), 1u);
  sent.insert(sent.end(), u->begin(), u->end());
  // The stopped task is gone from its machine's report: its new task starts.
  std::vector<Command> starts;
  for (MachineId m : ids_) {
    auto r = sched_.report(m, running_on(m, sent), 3);
    starts.insert(starts.end(), r.begin(), r.end());
  }
  ASSERT_EQ(starts.size(), 1u);
  ASSERT_EQ(starts[0].kind, Command::Kind::kStart);
  sent.push_back(starts[0]);
  // Running, not ready: nothing else of the job is stopped, however long it takes.
  for (uint64_t now = 4; now < 10; ++now) {
    auto rep = running_on(starts[0].machine, sent);
    rep[starts[0].task_id] = TaskState::kRunning;
    EXPECT_TRUE(sched_.report(starts[0].machine, rep, now).empty());
  }
  EXPECT_EQ(sched_.tasks().at(starts[0].task_id).state, TaskState::kRunning);
  EXPECT_FALSE(sched_.tasks().at(starts[0].task_id).ready);
  // Ready: the next old task is stopped.
  auto next = sched_.report(starts[0].machine, running_on(starts[0].machine, sent), 10);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].kind, Command::Kind::kStop);
  EXPECT_TRUE(sched_.tasks().at(starts[0].task_id).ready);
  sent.insert(sent.end(), next.begin(), next.end());
  // A ready task of the new generation that stops being ready is down again: after the
  // second new task starts, the third old one waits while the first is not ready.
  std::vector<Command> second;
  for (MachineId m : ids_) {
    auto r = sched_.report(m, running_on(m, sent), 11);
    second.insert(second.end(), r.begin(), r.end());
  }
  ASSERT_EQ(second.size(), 1u);
  ASSERT_EQ(second[0].kind, Command::Kind::kStart);
  sent.push_back(second[0]);
  auto flipped = running_on(starts[0].machine, sent);
  flipped[starts[0].task_id] = TaskState::kRunning;
  EXPECT_TRUE(sched_.report(starts[0].machine, flipped, 12).empty());
  EXPECT_FALSE(sched_.tasks().at(starts[0].task_id).ready);
  // The second becomes ready, but with the first down the limit is still reached.
  EXPECT_TRUE(sched_.report(second[0].machine, running_on(second[0].machine, sent), 13).empty());
  EXPECT_EQ(sched_.report(starts[0].machine, running_on(starts[0].machine, sent), 14).size(), 1u);
}

TEST_F(Sched, ADrainedCopyStopsOnlyOnceItsReplacementIsReady) {
  std::vector<Command> sent = create_running(spec("web", 1));
  MachineId drained = live("web")[0].machine;
  std::string old_id = live("web")[0].id;
  alloc_.set_usable(drained, false, true);
  auto d = sched_.moves().machine_drain(drained, 2);
  ASSERT_EQ(d.size(), 1u);
  sent.insert(sent.end(), d.begin(), d.end());
  auto rep = running_on(d[0].machine, sent);
  rep[d[0].task_id] = TaskState::kRunning;  // runs, not ready yet
  EXPECT_TRUE(sched_.report(d[0].machine, rep, 3).empty());
  EXPECT_EQ(sched_.tasks().at(old_id).state, TaskState::kDraining);
  auto stop = sched_.report(d[0].machine, running_on(d[0].machine, sent), 4);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(stop[0].task_id, old_id);
}

TEST_F(Sched, ScaleAndStop) {
  auto c = sched_.create(spec("web", 2), 0);
  ASSERT_TRUE(c.ok());
  std::vector<Command> sent = *c;
  auto up = sched_.scale("web", 5, 1);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(count_kind(*up, Command::Kind::kStart), 3);
  sent.insert(sent.end(), up->begin(), up->end());
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 2);
  EXPECT_EQ(live("web").size(), 5u);
  auto down = sched_.scale("web", 3, 3);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(count_kind(*down, Command::Kind::kStop), 2);
  EXPECT_EQ(count_kind(*down, Command::Kind::kStart), 0);
  sent.insert(sent.end(), down->begin(), down->end());
  for (MachineId m : ids_) EXPECT_TRUE(sched_.report(m, running_on(m, sent), 4).empty());
  EXPECT_EQ(live("web").size(), 3u);
  // The scale-down emptied two machines: the entitlement gives them back (Fig. 7), with
  // the sixth, which never held a task.
  EXPECT_EQ(alloc_.pool(1).machines, 3u);
  auto st = sched_.stop("web", 5);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(count_kind(*st, Command::Kind::kStop), 3);
  sent.insert(sent.end(), st->begin(), st->end());
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 6);
  EXPECT_FALSE(sched_.job("web"));                            // gone once every task stopped
  for (MachineId m : ids_) EXPECT_EQ(alloc_.tasks_on(m), 0);  // resources released
  EXPECT_EQ(alloc_.pool(1).machines, 0u);  // and every machine is back in the free pool
}

// A drain is make-before-break: the drained machine's task keeps running until its
// replacement runs elsewhere, then it is stopped; never two stops, never three copies.
TEST_F(Sched, DrainStartsTheReplacementBeforeStoppingTheOldCopy) {
  std::vector<Command> sent = create_running(spec("web", 2));
  ASSERT_EQ(live("web").size(), 2u);
  MachineId drained = live("web")[0].machine;
  std::string old_id = live("web")[0].id;
  alloc_.set_usable(drained, false, true);  // what the broker does first
  auto d = sched_.moves().machine_drain(drained, 2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, Command::Kind::kStart);  // the replacement, not a stop
  EXPECT_NE(d[0].machine, drained);
  EXPECT_EQ(sched_.tasks().at(old_id).state, TaskState::kDraining);
  sent.insert(sent.end(), d.begin(), d.end());
  // The drained machine still reports its copy running: nothing is stopped yet.
  EXPECT_TRUE(sched_.report(drained, running_on(drained, sent), 3).empty());
  EXPECT_EQ(sched_.tasks().at(old_id).state, TaskState::kDraining);
  // The replacement runs: the old copy is stopped now.
  auto stop = sched_.report(d[0].machine, running_on(d[0].machine, sent), 4);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(stop[0].kind, Command::Kind::kStop);
  EXPECT_EQ(stop[0].task_id, old_id);
  EXPECT_EQ(stop[0].machine, drained);
  sent.insert(sent.end(), stop.begin(), stop.end());
  EXPECT_TRUE(sched_.report(drained, running_on(drained, sent), 5).empty());
  EXPECT_EQ(sched_.tasks().at(old_id).state, TaskState::kStopped);
  EXPECT_EQ(live("web").size(), 2u);
  for (const auto& t : live("web")) EXPECT_NE(t.machine, drained);
}

// A draining copy whose machine then dies is stopped, not replaced a second time.
TEST_F(Sched, DrainedMachineDyingDoesNotReplaceTwice) {
  std::vector<Command> sent = create_running(spec("web", 1));
  MachineId drained = live("web")[0].machine;
  alloc_.set_usable(drained, false, true);  // what the broker does first
  auto d = sched_.moves().machine_drain(drained, 2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(sched_.replacement().machine_down(drained, 3).empty());
  size_t tasks = 0;
  for (const auto& t : sched_.tasks().of_job("web"))
    tasks += t.state == TaskState::kStarting || t.state == TaskState::kRunning;
  EXPECT_EQ(tasks, 1u);
}

// After a restart, a lost task whose replacement had not been placed yet (no budget, no
// room) waits again; an index that runs is left alone.
TEST_F(Sched, RestoreRebuildsWhatWaitsForItsReplacement) {
  Scheduler s2(alloc_);
  s2.handover().restore_job({spec("web", 3), 1, false});
  auto task = [](std::string id, int index, TaskState st, uint64_t since) {
    TaskRecord t;
    t.id = std::move(id);
    t.job = "web";
    t.index = index;
    t.state = st;
    t.since_us = since;
    return t;
  };
  s2.handover().restore_task(task("web.0.1", 0, TaskState::kLost, 5));      // waits
  s2.handover().restore_task(task("web.1.2", 1, TaskState::kLost, 5));      // replaced already:
  s2.handover().restore_task(task("web.1.4", 1, TaskState::kRunning, 6));   //   runs
  s2.handover().restore_task(task("web.2.3", 2, TaskState::kDraining, 5));  // waits, still running
  s2.handover().finish_restore();
  EXPECT_EQ(s2.replacement().waiting_for_budget(), 2u);
}

// A start sent while its machine was away (or lost on the way) is sent again once the
// machine reports without it, well before the task would count as lost.
TEST_F(Sched, UnreportedStartIsSentAgain) {
  auto c = sched_.create(spec("web", 1), 0);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 1u);
  MachineId m = (*c)[0].machine;
  EXPECT_TRUE(sched_.report(m, {}, 1'000'000).empty());  // in flight: not yet
  auto again = sched_.report(m, {}, 6'000'000);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].kind, Command::Kind::kStart);
  EXPECT_EQ(again[0].task_id, (*c)[0].task_id);
  EXPECT_EQ(sched_.tasks().at((*c)[0].task_id).state, TaskState::kStarting);
}

// The daemon writes after a report only when it changed something.
TEST_F(Sched, ReportsSayWhichJobsTheyChanged) {
  auto c = sched_.create(spec("web", 1), 0);
  ASSERT_TRUE(c.ok());
  MachineId m = (*c)[0].machine;
  sched_.report(m, running_on(m, *c), 1);
  EXPECT_EQ(sched_.take_reported_changes(), std::set<std::string>{"web"});  // now running
  sched_.report(m, running_on(m, *c), 2);
  EXPECT_TRUE(sched_.take_reported_changes().empty());  // the same again: nothing to write
  sched_.report(m, {}, 3);                              // gone from the report: lost
  EXPECT_EQ(sched_.take_reported_changes(), std::set<std::string>{"web"});
}

// A stop recorded but never delivered (the control plane restarted in between) is sent
// again when the machine still reports the task running.
TEST_F(Sched, StopStillRunningIsSentAgain) {
  auto c = sched_.create(spec("web", 1), 0);
  ASSERT_TRUE(c.ok());
  MachineId m = (*c)[0].machine;
  sched_.report(m, running_on(m, *c), 1);
  auto st = sched_.stop("web", 2);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 1u);
  EXPECT_TRUE(sched_.report(m, running_on(m, *c), 3'000'000).empty());  // in flight
  auto again = sched_.report(m, running_on(m, *c), 6'000'000);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].kind, Command::Kind::kStop);
}

TEST_F(Sched, BadRequestsChangeNothing) {
  EXPECT_EQ(sched_.create(spec("", 1), 0).error().field, "name");
  EXPECT_EQ(sched_.create(spec("a.b", 1), 0).error().field, "name");
  EXPECT_EQ(sched_.create(spec("w", 0), 0).error().field, "count");
  JobSpec huge = spec("huge", 100);  // 100 cores on a 24-core fleet
  EXPECT_FALSE(sched_.create(huge, 0).ok());
  EXPECT_FALSE(sched_.job("huge"));
  for (MachineId m : ids_) EXPECT_EQ(alloc_.tasks_on(m), 0);
  ASSERT_TRUE(sched_.create(spec("w", 1), 0).ok());
  EXPECT_EQ(sched_.create(spec("w", 1), 0).error().field, "name");
  EXPECT_FALSE(sched_.scale("nope", 2, 0).ok());
  EXPECT_FALSE(sched_.scale("w", 100, 0).ok());
  EXPECT_EQ(live("w").size(), 1u);
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// Finding 10: a job whose tasks keep failing is replaced only as the destructive budget
// allows, whatever path asks (converge after a confirmed stop included).
TEST_F(Sched, ReplacementsNeverBypassTheBudget) {
  Scheduler sched(alloc_, SchedulerLimits{0.0001, 1});
  auto c = sched.create(spec("web", 2), 0);
  ASSERT_TRUE(c.ok());
  std::map<std::string, MachineId> where;
  for (const auto& cmd : *c) where[cmd.task_id] = cmd.machine;
  for (const auto& [id, m] : where) sched.report(m, {{id, TaskState::kReady}}, 1);
  // Index 0 fails: the one token replaces it.
  std::string first = c->at(0).task_id;
  int idx0 = sched.tasks().at(first).index;
  auto r1 = sched.report(where[first], {{first, TaskState::kFailed}}, 2);
  ASSERT_EQ(count_kind(r1, Command::Kind::kStart), 1);
  std::string second = r1[0].task_id;
  sched.report(r1[0].machine, {{second, TaskState::kFailed}}, 3);  // fails again: no token left
  // An update's stop of index 1 is confirmed: converge runs for the job.
  JobSpec updated = spec("web", 2);
  updated.task = {{"argv", {"/bin/sleep", "1000"}}};
  auto u = sched.rollouts().update(updated, 4);
  ASSERT_TRUE(u.ok());
  std::vector<Command> all = *u;
  for (const auto& cmd : *u)
    if (cmd.kind == Command::Kind::kStop) {
      auto more = sched.report(cmd.machine, {{cmd.task_id, TaskState::kStopped}}, 5);
      all.insert(all.end(), more.begin(), more.end());
    }
  for (int i = 0; i < 50; ++i) {
    auto more = sched.tick(6 + static_cast<uint64_t>(i));
    all.insert(all.end(), more.begin(), more.end());
  }
  for (const auto& cmd : all) {
    if (cmd.kind == Command::Kind::kStart) {
      EXPECT_NE(sched.tasks().at(cmd.task_id).index, idx0) << "index 0 restarted without a token";
    }
  }
  EXPECT_EQ(sched.replacement().waiting_for_budget(), 1u);
}

// Finding 4: ended tasks are forgotten once reported and old, so the task table (and
// each machine's report) stays the size of the job, however many tasks ever ran.
TEST_F(Sched, EndedTasksAreForgottenAndTheTableStaysBounded) {
  Scheduler sched(alloc_, SchedulerLimits{1e9, 1e9});
  auto c = sched.create(spec("churn", 2), 0);
  ASSERT_TRUE(c.ok());
  std::vector<Command> current = *c;
  uint64_t now = 1;
  size_t biggest = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<Command> next;
    for (const auto& cmd : current) {
      if (cmd.kind != Command::Kind::kStart) continue;
      sched.report(cmd.machine, {{cmd.task_id, TaskState::kReady}}, now++);
      std::vector<std::string> forget;
      auto r = sched.report(cmd.machine, {{cmd.task_id, TaskState::kFailed}}, now++, &forget);
      EXPECT_EQ(forget, std::vector<std::string>{cmd.task_id});
      next.insert(next.end(), r.begin(), r.end());
    }
    current = next;
    sched.prune(now, 100);
    biggest = std::max(biggest, sched.tasks().size());
  }
  // 4,000 tasks ran; the table holds the live two plus what ended in the last 100 us
  // (4 us a round, two tasks each).
  EXPECT_LE(biggest, 2u + 2 * (100 / 4) + 2);
  // A machine reporting an ended task the scheduler already forgot is told to forget it.
  std::vector<std::string> forget;
  sched.report(ids_[0], {{"churn.0.1", TaskState::kFailed}}, now, &forget);
  EXPECT_EQ(forget, std::vector<std::string>{"churn.0.1"});
  // A stopped job's tasks go at once.
  ASSERT_TRUE(sched.stop("churn", now).ok());
  for (const auto& [id, t] :
       std::map<std::string, TaskRecord>(sched.tasks().begin(), sched.tasks().end()))
    sched.report(t.machine, {{id, TaskState::kStopped}}, now + 1);
  sched.prune(now + 2, 1'000'000'000);
  EXPECT_TRUE(sched.tasks().empty());
}

// Finding 12: a create whose write failed is undone in memory.
TEST_F(Sched, AbandonedCreateLeavesNothingBehind) {
  auto free_before = alloc_.free(ids_[0]);
  ASSERT_TRUE(sched_.create(spec("web", 3), 0).ok());
  sched_.abandon("web");
  EXPECT_TRUE(sched_.tasks().empty());
  EXPECT_FALSE(sched_.job("web").has_value());
  EXPECT_TRUE(alloc_.placement("web").empty());
  EXPECT_EQ(alloc_.free(ids_[0]), free_before);
  EXPECT_TRUE(sched_.create(spec("web", 3), 1).ok());  // not "already exists"
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// Issue 12: an entitlement pinned to a data centre gets machines of that DC only.
TEST(SchedDc, AnEntitlementsDcPinIsAHardConstraint) {
  Allocator alloc;
  std::vector<MachineId> dc1, dc2;
  for (int i = 0; i < 3; ++i) {
    dc1.push_back(alloc.add_machine(
        {"a" + std::to_string(i), "dc1", "r" + std::to_string(i), "x", {4000, 8192}}));
    dc2.push_back(alloc.add_machine(
        {"b" + std::to_string(i), "dc2", "s" + std::to_string(i), "x", {4000, 8192}}));
  }
  alloc.set_quota(1, 3);
  Scheduler sched(alloc);
  sched.placer().set_entitlement_dc([](EntitlementId e) { return e == 1 ? "dc2" : ""; });
  JobSpec s;
  s.name = "pinned";
  s.count = 3;
  s.per_task = {1000, 1024};
  auto c = sched.create(s, 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  for (const auto& cmd : *c)
    EXPECT_NE(std::find(dc2.begin(), dc2.end(), cmd.machine), dc2.end())
        << "task on a machine outside dc2";
}

// Issue 12: a rolling update counts every unavailable task, whatever the reason: with
// one task already lost (and its replacement waiting for the budget) and
// max_unavailable = 1, the update stops nothing until that index runs again.
TEST_F(Sched, RollingUpdateCountsTasksDownForAnyReason) {
  Scheduler sched(alloc_, SchedulerLimits{0.0001, 0});  // no budget: the lost one waits
  JobSpec s = spec("web", 4);
  s.max_unavailable = 1;
  auto c = sched.create(s, 0);
  ASSERT_TRUE(c.ok());
  std::vector<Command> sent = *c;
  for (MachineId m : ids_) sched.report(m, running_on(m, sent), 1);
  MachineId victim = c->at(0).machine;
  sched.replacement().machine_down(victim, 2);  // its task is lost; no token to replace it
  s.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched.rollouts().update(s, 3);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(count_kind(*u, Command::Kind::kStop), 0) << "a second task would be down";
}

// Issue 12: a start the machine refuses fails the task at once, with the machine's
// message, instead of sitting in "starting" for the start grace and being "replaced"
// with the same spec in a loop. A refused spec waits for an update.
TEST_F(Sched, ARefusedSpecFailsAtOnceAndWaitsForAnUpdate) {
  auto c = sched_.create(spec("web", 2), 0);
  ASSERT_TRUE(c.ok());
  std::string refused = (*c)[0].task_id;
  std::string fine = (*c)[1].task_id;
  sched_.report((*c)[1].machine, {{fine, TaskState::kReady}}, 1);
  (void)sched_.take_reported_changes();
  auto r = sched_.start_refused(refused, "user: no such user 'svc'", /*bad_spec=*/true, 2);
  EXPECT_EQ(count_kind(r, Command::Kind::kStart), 0) << "a refused spec is not retried";
  const TaskRecord& t = sched_.tasks().at(refused);
  EXPECT_EQ(t.state, TaskState::kFailed);
  EXPECT_EQ(t.message, "user: no such user 'svc'");
  EXPECT_EQ(sched_.take_reported_changes(), std::set<std::string>{"web"});
  // Nothing restarts it: not the ticks, not the reports, not the start grace.
  for (uint64_t now = 3; now < 5 * kMin; now += kMin / 4) {
    auto more = sched_.tick(now);
    auto rep = sched_.report((*c)[1].machine, {{fine, TaskState::kReady}}, now);
    more.insert(more.end(), rep.begin(), rep.end());
    EXPECT_EQ(count_kind(more, Command::Kind::kStart), 0) << now;
  }
  EXPECT_EQ(sched_.tasks().of_job("web").size(), 2u);
  // A late refusal (a resend refused as a duplicate) of a running task changes nothing.
  EXPECT_TRUE(sched_.start_refused(fine, "name: exists", true, 6 * kMin).empty());
  EXPECT_EQ(sched_.tasks().at(fine).state, TaskState::kRunning);
  // An update brings a new spec: the refused index starts at once under it.
  JobSpec fixed = spec("web", 2);
  fixed.task = {{"argv", {"/bin/sleep", "1000"}}, {"user", "nobody"}};
  auto u = sched_.rollouts().update(fixed, 6 * kMin);
  ASSERT_TRUE(u.ok());
  int starts_for_0 = 0;
  for (const auto& cmd : *u)
    if (cmd.kind == Command::Kind::kStart && sched_.tasks().at(cmd.task_id).index == 0) {
      ++starts_for_0;
      EXPECT_EQ(cmd.run_params()["user"], "nobody");
    }
  EXPECT_EQ(starts_for_0, 1);
}

// Issue 32 (10): a task whose setup fails the same way wherever it goes was replaced
// about 100 times in 10 s, and the machine's reason never reached MESSAGE. The reason
// is the MESSAGE; the same setup failure kSetupFailuresHeld times in a row holds the
// index until the spec changes; a failure of the program itself is replaced as ever.
TEST_F(Sched, TheSameSetupFailureAgainAndAgainHoldsTheIndexWithTheReason) {
  auto c = sched_.create(spec("web", 1), 0);
  ASSERT_TRUE(c.ok());
  std::string id = (*c)[0].task_id;
  MachineId m = (*c)[0].machine;
  const std::string why = "cannot execute /no/such/program: No such file or directory";
  uint64_t now = 1;
  // A program that ran and failed: replaced, its reason kept.
  weft::TaskFailures ran{{id, {"exited with code 3", false}}};
  auto r = sched_.report_list(m, {{id, TaskState::kFailed}}, now, nullptr, &ran);
  EXPECT_EQ(sched_.tasks().at(id).message, "exited with code 3");
  ASSERT_EQ(count_kind(r, Command::Kind::kStart), 1);
  for (int i = 1; i <= kSetupFailuresHeld; ++i) {
    id = r[0].task_id;
    m = r[0].machine;
    now += kMin;  // the replacement budget is not what holds it
    weft::TaskFailures setup{{id, {why, true}}};
    r = sched_.report_list(m, {{id, TaskState::kFailed}}, now, nullptr, &setup);
    const TaskRecord& t = sched_.tasks().at(id);
    EXPECT_EQ(t.state, TaskState::kFailed);
    if (i < kSetupFailuresHeld) {
      EXPECT_EQ(t.message, why);
      EXPECT_FALSE(t.held);
      ASSERT_EQ(count_kind(r, Command::Kind::kStart), 1) << "failure " << i << " is replaced";
    } else {
      EXPECT_TRUE(t.held);
      EXPECT_NE(t.message.find(why), std::string::npos) << t.message;
      EXPECT_NE(t.message.find("3 times in a row"), std::string::npos) << t.message;
      EXPECT_EQ(count_kind(r, Command::Kind::kStart), 0) << "held, not replaced";
    }
  }
  for (now += kMin; now < 10 * kMin; now += kMin / 2)
    EXPECT_EQ(count_kind(sched_.tick(now), Command::Kind::kStart), 0) << now;
  // A new spec starts the index again, and its count from zero.
  JobSpec fixed = spec("web", 1);
  fixed.task = {{"argv", {"/bin/sleep", "1000"}}};
  auto u = sched_.rollouts().update(fixed, now);
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(count_kind(*u, Command::Kind::kStart), 1);
  for (const auto& cmd : *u) {
    if (cmd.kind == Command::Kind::kStart) {
      EXPECT_EQ(sched_.tasks().at(cmd.task_id).setup_failures, 0);
    }
  }
}

TEST_F(Sched, ARefusalThatIsNotTheSpecsIsReplacedLikeAFailure) {
  auto c = sched_.create(spec("web", 1), 0);
  ASSERT_TRUE(c.ok());
  std::string id = (*c)[0].task_id;
  auto r = sched_.start_refused(id, "create cgroup: Device or resource busy", false, 1);
  ASSERT_EQ(count_kind(r, Command::Kind::kStart), 1);
  EXPECT_EQ(sched_.tasks().at(id).state, TaskState::kFailed);
  EXPECT_EQ(sched_.tasks().at(r[0].task_id).index, 0);
}

// Issue 12: with the entitlement's quota fully used, a dead machine's tasks still move
// (its slot goes to the replacement; before: "0 of 1 tasks could be moved").
TEST(SchedQuota, ADeadMachinesTasksMoveWhenTheQuotaIsFull) {
  Allocator alloc;
  std::vector<MachineId> ids;
  for (int d = 0; d < 3; ++d)
    ids.push_back(alloc.add_machine(
        {"q" + std::to_string(d), "dc1", "rack" + std::to_string(d), "a", {4000, 8192}}));
  alloc.set_quota(1, 2);
  Scheduler sched(alloc, SchedulerLimits{60, 5});
  JobSpec s;
  s.name = "full";
  s.count = 2;
  s.per_task = {4000, 1024};  // a whole machine each: the quota is used up
  s.task = {{"argv", {"/bin/true"}}};
  auto c = sched.create(s, 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  for (const auto& cmd : *c) sched.report(cmd.machine, {{cmd.task_id, TaskState::kReady}}, 1);
  MachineId dead = (*c)[0].machine;
  alloc.set_usable(dead, /*healthy=*/false, true);
  auto r = sched.replacement().machine_down(dead, 2);
  ASSERT_EQ(r.size(), 1u) << "the lost task was not replaced";
  EXPECT_EQ(r[0].kind, Command::Kind::kStart);
  EXPECT_NE(r[0].machine, dead);
  EXPECT_NE(r[0].machine, (*c)[1].machine);
}

// The daemon writes a job's row (record and placement) only when the scheduler or the
// allocator says it changed, not whenever one of its tasks does: every change to a row,
// through every kind of operation, must be announced.
TEST_F(Sched, EveryChangeToAJobsRowIsAnnounced) {
  auto rows = [&] {
    std::map<std::string, std::string> out;
    for (const auto& j : sched_.handover().persisted_jobs()) {
      std::string row = std::to_string(j.generation) + (j.stopping ? " stopping " : " ") +
                        std::to_string(j.spec.count) + " " + j.spec.task.dump() + " |";
      for (MachineId m : alloc_.placement(j.spec.name)) row += " " + std::to_string(m);
      out[j.spec.name] = row;
    }
    return out;
  };
  auto before = rows();
  int steps = 0;
  auto check = [&](const char* step) {
    ++steps;
    std::set<std::string> announced = sched_.take_changed_jobs();
    announced.merge(alloc_.take_changed_jobs());
    auto after = rows();
    std::set<std::string> names;
    for (const auto& [n, r] : before) names.insert(n);
    for (const auto& [n, r] : after) names.insert(n);
    for (const auto& n : names)
      if (before[n] != after[n]) {
        EXPECT_TRUE(announced.count(n)) << step << ": " << n;
      }
    before = std::move(after);
  };
  std::vector<Command> sent;
  auto settle = [&](uint64_t now) {  // reports until they cause nothing more
    for (int round = 0; round < 10; ++round) {
      std::vector<Command> next = report_all(sent, now);
      sent.insert(sent.end(), next.begin(), next.end());
      if (next.empty()) break;
    }
  };
  JobSpec web = spec("web", 4), db = spec("db", 2);
  auto c = sched_.create(web, 0);
  ASSERT_TRUE(c.ok());
  sent = *c;
  c = sched_.create(db, 0);
  ASSERT_TRUE(c.ok());
  sent.insert(sent.end(), c->begin(), c->end());
  check("create");
  settle(1);
  check("running");
  web.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched_.rollouts().update(web, 2);
  ASSERT_TRUE(u.ok());
  sent.insert(sent.end(), u->begin(), u->end());
  check("update");
  settle(3);
  check("rolled");
  auto up = sched_.scale("db", 3, 4);
  ASSERT_TRUE(up.ok());
  sent.insert(sent.end(), up->begin(), up->end());
  check("scale up");
  auto down = sched_.scale("web", 2, 5);
  ASSERT_TRUE(down.ok());
  sent.insert(sent.end(), down->begin(), down->end());
  settle(6);
  check("scale down");
  MachineId dead = sched_.tasks().of_job("db").front().machine;
  alloc_.set_usable(dead, false, true);
  auto r = sched_.replacement().machine_down(dead, 7);
  sent.insert(sent.end(), r.begin(), r.end());
  std::erase_if(sent, [&](const Command& cmd) { return cmd.machine == dead; });
  check("machine down");
  settle(8);
  check("replaced");
  auto st = sched_.stop("db", 9);
  ASSERT_TRUE(st.ok());
  sent.insert(sent.end(), st->begin(), st->end());
  check("stop");
  settle(10);
  EXPECT_FALSE(sched_.job("db"));
  check("stopped");
  EXPECT_EQ(steps, 10);
}

// TaskControl: a job that names a controller restarts only what the controller acked,
// and no more at once than max_unavailable (issue 32: a controller that acked every
// restart took the whole job down); acks of unknown or finished operations change
// nothing; a restart completes when its index runs again.
TEST_F(Sched, AControlledUpdateRestartsOnlyWhatTheControllerAcked) {
  JobSpec s = spec("web", 4);
  s.max_unavailable = 1;
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  std::vector<Command> sent = create_running(s);
  EXPECT_EQ(sched_.operations().controlled_jobs(), std::vector<std::string>{"web"});
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());
  s.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->empty());  // nothing moves before an ack
  auto ops = sched_.operations().pending_operations("web");
  ASSERT_EQ(ops.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ops[static_cast<size_t>(i)].kind, "restart");
    EXPECT_EQ(ops[static_cast<size_t>(i)].index, i);
    EXPECT_EQ(ops[static_cast<size_t>(i)].id, "restart/" + ops[static_cast<size_t>(i)].task);
  }
  // A partial ack of two, with an id nobody asked for: one restart at a time
  // (max_unavailable 1), the other acknowledged one waits for it.
  auto g = sched_.operations().grant("web", {ops[0].id, ops[2].id, "restart/web.9.99"}, 3);
  ASSERT_EQ(count_kind(g, Command::Kind::kStop), 1);
  EXPECT_EQ(g[0].task_id, ops[0].task);
  sent.insert(sent.end(), g.begin(), g.end());
  EXPECT_TRUE(sched_.operations().grant("web", {ops[0].id}, 4).empty());  // already performed
  // The stop is confirmed: the new generation starts in that slot only.
  std::vector<Command> next = report_all(sent, 5);
  EXPECT_EQ(count_kind(next, Command::Kind::kStart), 1);
  EXPECT_EQ(count_kind(next, Command::Kind::kStop), 0) << "index 2 waits for index 0";
  EXPECT_TRUE(sched_.operations().take_completed("web").empty());  // not running yet
  sent.insert(sent.end(), next.begin(), next.end());
  // Index 0 runs again: the acknowledged restart of index 2 goes, without a new ack.
  std::vector<Command> more;
  for (MachineId m : ids_) {
    auto r = sched_.report(m, running_on(m, sent), 6);
    more.insert(more.end(), r.begin(), r.end());
  }
  ASSERT_EQ(count_kind(more, Command::Kind::kStop), 1);
  EXPECT_EQ(more[0].task_id, ops[2].task);
  sent.insert(sent.end(), more.begin(), more.end());
  next = report_all(sent, 7);
  EXPECT_EQ(count_kind(next, Command::Kind::kStart), 1);
  sent.insert(sent.end(), next.begin(), next.end());
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 8);
  auto done = sched_.operations().take_completed("web");
  std::sort(done.begin(), done.end());
  std::vector<std::string> want{ops[0].id, ops[2].id};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(done, want);
  EXPECT_TRUE(sched_.operations().take_completed("web").empty());  // told once
  auto tasks = sched_.operations().controlled_tasks("web");
  ASSERT_EQ(tasks.size(), 4u);
  for (const auto& t : tasks) EXPECT_EQ(t.state, TaskState::kRunning) << t.task;
  // A job without a controller has no operations to ask about.
  ASSERT_TRUE(sched_.create(spec("plain", 1), 9).ok());
  EXPECT_TRUE(sched_.operations().pending_operations("plain").empty());
  EXPECT_EQ(sched_.operations().controlled_jobs(), std::vector<std::string>{"web"});
}

// The controller unreachable past its timeout ("proceed"): the update goes on at
// max_unavailable pacing; when it answers again, only its acks move the job.
TEST_F(Sched, AnUnreachableControllerFallsBackToMaxUnavailable) {
  JobSpec s = spec("web", 4);
  s.max_unavailable = 1;
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  std::vector<Command> sent = create_running(s);
  s.task["argv"] = {"/bin/sleep", "1000"};
  ASSERT_TRUE(sched_.rollouts().update(s, 2).ok());
  auto ops = sched_.operations().pending_operations("web");
  auto g = sched_.operations().grant("web", {ops[3].id}, 2);  // acked, then silence
  ASSERT_EQ(g.size(), 1u);
  sent.insert(sent.end(), g.begin(), g.end());
  auto f = sched_.operations().set_control_fallback("web", true, 3);
  EXPECT_TRUE(sched_.operations().control_fallback("web"));
  // One already down (index 3, acked): max_unavailable 1 allows no more now.
  sent.insert(sent.end(), f.begin(), f.end());
  std::vector<Command> all;
  uint64_t now = 4;
  for (int step = 0; step < 20; ++step) {
    std::vector<Command> next = report_all(sent, now++);
    if (next.empty()) break;
    EXPECT_LE(count_kind(next, Command::Kind::kStop), 1);
    sent.insert(sent.end(), next.begin(), next.end());
    all.insert(all.end(), next.begin(), next.end());
  }
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());  // the whole update went
  for (const auto& t : sched_.operations().controlled_tasks("web"))
    EXPECT_EQ(t.state, TaskState::kRunning);
  // Back: a new update waits for acks again.
  EXPECT_TRUE(sched_.operations().set_control_fallback("web", false, now).empty());
  s.task["argv"] = {"/bin/sleep", "2000"};
  auto u = sched_.rollouts().update(s, now + 1);
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->empty());
  EXPECT_EQ(sched_.operations().pending_operations("web").size(), 4u);
}

// Autoscaling's scale-down of a controlled job goes through its controller: each task
// above the new count is a pending `stop`, stopped when acknowledged and not replaced
// meanwhile; the count follows once none runs. The controller unreachable, the rest
// stops at once; an operator's scale goes at once and ends a shrink waiting.
// The ReBalancer's move: make before break to the machine it chose (the copy starts
// there; the task stops once the copy is ready), one token of the destructive budget a
// move, never more of a job at once than its max_unavailable, and refused with nothing
// changed when the job is not all ready or the machine cannot take the task.
TEST_F(Sched, ARebalancingMoveIsMakeBeforeBreakToTheChosenMachine) {
  std::vector<Command> sent = create_running(spec("web", 3));
  const std::string moved = sent[0].task_id;
  const MachineId from = sent[0].machine;
  std::set<MachineId> used;
  for (const auto& cmd : sent) used.insert(cmd.machine);
  MachineId to = ids_[0];
  for (MachineId m : ids_)
    if (!used.count(m)) to = m;
  // Refused: where it runs, no such task or machine.
  EXPECT_FALSE(sched_.moves().move_task(moved, from, "r", 2).ok());
  EXPECT_FALSE(sched_.moves().move_task("web.9.9", to, "r", 2).ok());
  EXPECT_FALSE(sched_.moves().move_task(moved, 999, "r", 2).ok());

  auto r = sched_.moves().move_task(moved, to, "rebalance: spread", 2);
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].kind, Command::Kind::kStart);
  EXPECT_EQ((*r)[0].machine, to);
  EXPECT_EQ(sched_.tasks().at(moved).state, TaskState::kDraining);  // still running
  EXPECT_TRUE(sched_.moves().moving(moved));
  EXPECT_EQ(alloc_.placement("web")[static_cast<size_t>(sched_.tasks().at(moved).index)], to);
  // max_unavailable 1: no second move of the job while this one is under way.
  auto second = sched_.moves().move_task(sent[1].task_id, from, "r", 3);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().str().find("not ready or moving"), std::string::npos);
  sent.insert(sent.end(), r->begin(), r->end());
  // The copy runs but is not ready: the task runs on.
  std::map<std::string, TaskState> at_to = running_on(to, sent);
  at_to[(*r)[0].task_id] = TaskState::kRunning;
  EXPECT_TRUE(sched_.report(to, at_to, 4).empty());
  EXPECT_EQ(sched_.tasks().at(moved).state, TaskState::kDraining);
  // Ready: the task is stopped.
  auto next = sched_.report(to, running_on(to, sent), 5);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].kind, Command::Kind::kStop);
  EXPECT_EQ(next[0].task_id, moved);
  EXPECT_EQ(next[0].machine, from);
  sent.insert(sent.end(), next.begin(), next.end());
  report_all(sent, 6);
  EXPECT_FALSE(sched_.moves().moving(moved));
  EXPECT_EQ(live("web").size(), 3u);
  // The machine it left is empty: back in the free pool (so are the ones never used).
  EXPECT_EQ(alloc_.entitlement_of(from), kFreePool);
  ASSERT_TRUE(alloc_.assign(from, 1).ok());

  // The budget (a burst of 2 here): the second move takes the last token, a third waits.
  auto again = sched_.moves().move_task(sent[1].task_id, from, "r", 7);
  ASSERT_TRUE(again.ok()) << again.error().str();
  sent.insert(sent.end(), again->begin(), again->end());
  auto stops = report_all(sent, 8);  // the copy is ready: the task stops
  ASSERT_EQ(count_kind(stops, Command::Kind::kStop), 1);
  sent.insert(sent.end(), stops.begin(), stops.end());
  report_all(sent, 9);
  ASSERT_EQ(live("web").size(), 3u);
  std::set<MachineId> now_used;
  for (const auto& t : live("web")) now_used.insert(t.machine);
  MachineId spare = ids_[0];
  for (MachineId m : ids_)
    if (!now_used.count(m)) spare = m;
  ASSERT_TRUE(alloc_.assign(spare, 1).ok());
  auto spent = sched_.moves().move_task(live("web")[0].id, spare, "r", 11);
  ASSERT_FALSE(spent.ok());
  EXPECT_NE(spent.error().str().find("budget"), std::string::npos);
}

// max_unavailable 2: two of the job's tasks may move at once, not a third; a task that
// is not ready counts against it as a move does.
TEST_F(Sched, RebalancingMovesOfAJobStayWithinItsMaxUnavailable) {
  JobSpec s = spec("web", 3);
  s.max_unavailable = 2;
  auto c = sched_.create(s, 0);
  ASSERT_TRUE(c.ok());
  for (MachineId m : ids_) sched_.report(m, running_on(m, *c), 1);
  std::set<MachineId> used;
  for (const auto& cmd : *c) used.insert(cmd.machine);
  std::vector<MachineId> spare;
  for (MachineId m : ids_)
    if (!used.count(m)) spare.push_back(m);
  ASSERT_GE(spare.size(), 3u);
  ASSERT_TRUE(sched_.moves().move_task((*c)[0].task_id, spare[0], "r", 2).ok());
  ASSERT_TRUE(sched_.moves().move_task((*c)[1].task_id, spare[1], "r", 2).ok());
  auto third = sched_.moves().move_task((*c)[2].task_id, spare[2], "r", 2);
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.error().str().find("2 tasks not ready or moving (max_unavailable 2)"),
            std::string::npos)
      << third.error().str();
}

// A job with a TaskController is asked first: a pending `move` with the ReBalancer's
// reason, carried out to the chosen machine when acknowledged; withdrawn, it is gone.
TEST_F(Sched, ARebalancingMoveOfAControlledJobWaitsForItsController) {
  JobSpec s = spec("web", 2);
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  std::vector<Command> sent = create_running(s);
  std::set<MachineId> used;
  for (const auto& cmd : sent) used.insert(cmd.machine);
  std::vector<MachineId> spare;
  for (MachineId m : ids_)
    if (!used.count(m)) spare.push_back(m);
  const std::string task = sent[0].task_id;
  auto r = sched_.moves().move_task(task, spare[0], "rebalance: free a whole machine", 2);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_TRUE(r->empty());  // nothing before the controller says so
  EXPECT_TRUE(sched_.moves().moving(task));
  auto ops = sched_.operations().pending_operations("web");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].id, "move/" + task);
  EXPECT_EQ(ops[0].kind, "move");
  EXPECT_EQ(ops[0].reason, "rebalance: free a whole machine");
  auto g = sched_.operations().grant("web", {ops[0].id}, 3);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].kind, Command::Kind::kStart);
  EXPECT_EQ(g[0].machine, spare[0]);
  EXPECT_EQ(sched_.tasks().at(task).state, TaskState::kDraining);
  sent.insert(sent.end(), g.begin(), g.end());
  auto stop = report_all(sent, 4);
  ASSERT_EQ(count_kind(stop, Command::Kind::kStop), 1);
  sent.insert(sent.end(), stop.begin(), stop.end());
  report_all(sent, 5);
  EXPECT_FALSE(sched_.moves().moving(task));
  EXPECT_EQ(sched_.operations().take_completed("web"), std::vector<std::string>{"move/" + task});

  // Asked and withdrawn (its controller took too long): nothing pending, nothing moved.
  const std::string other = live("web")[0].id;
  ASSERT_TRUE(alloc_.assign(spare[1], 1).ok());  // (empty machines went back to the free pool)
  ASSERT_TRUE(sched_.moves().move_task(other, spare[1], "rebalance: balance CPU", 6).ok());
  EXPECT_EQ(sched_.operations().pending_operations("web").size(), 1u);
  EXPECT_TRUE(sched_.moves().withdraw_move(other));
  EXPECT_FALSE(sched_.moves().withdraw_move(other));
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());
  EXPECT_FALSE(sched_.moves().moving(other));
  EXPECT_EQ(sched_.tasks().at(other).state, TaskState::kRunning);
}

// An operator's restart of one task: at once without a controller (it stops, and its
// index starts again on its machine once it has); with one, a pending `restart` with the
// reason, performed when acknowledged; a task that is not running is refused.
TEST_F(Sched, AnOperatorRestartsOneTask) {
  std::vector<Command> sent = create_running(spec("web", 2));
  const std::string task = sent[0].task_id;
  const MachineId machine = sent[0].machine;
  bool waits = true;
  auto r = sched_.operations().restart_task(task, "restarted by alice", 2, &waits);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_FALSE(waits);
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].kind, Command::Kind::kStop);
  EXPECT_EQ((*r)[0].task_id, task);
  sent.insert(sent.end(), r->begin(), r->end());
  auto next = report_all(sent, 3);  // it stopped: its index starts again, on its machine
  ASSERT_EQ(count_kind(next, Command::Kind::kStart), 1);
  EXPECT_EQ(next[0].machine, machine);
  EXPECT_NE(next[0].task_id, task);
  EXPECT_FALSE(sched_.operations().restart_task(task, "again", 4, &waits).ok());  // stopped now
  EXPECT_EQ(sched_.operations().restart_task("web.7.7", "x", 4, &waits).error().code,
            rpc::kNotFound);

  JobSpec s = spec("kv", 2);
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  auto k = sched_.create(s, 5);
  ASSERT_TRUE(k.ok());
  sent.insert(sent.end(), k->begin(), k->end());
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 6);
  const std::string kv = (*k)[1].task_id;
  r = sched_.operations().restart_task(kv, "restarted by bob", 7, &waits);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(waits);
  EXPECT_TRUE(r->empty());
  auto ops = sched_.operations().pending_operations("kv");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].id, "restart/" + kv);
  EXPECT_EQ(ops[0].kind, "restart");
  EXPECT_EQ(ops[0].reason, "restarted by bob");
  auto g = sched_.operations().grant("kv", {ops[0].id}, 8);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].kind, Command::Kind::kStop);
  EXPECT_EQ(g[0].task_id, kv);
  EXPECT_TRUE(sched_.operations().pending_operations("kv").empty());
}

// A task its machine says is not live is restarted as an operator's restart is: its
// controller asked first (once, however often the machine says it), and paid for from
// the destructive budget (spent: refused, said again later).
TEST_F(Sched, ATaskThatIsNotLiveIsRestartedThroughItsController) {
  std::vector<Command> sent = create_running(spec("web", 3));
  bool waits = true;
  auto r =
      sched_.operations().liveness_failed(sent[0].task_id, "3 failed: exit status 1", 2, &waits);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_FALSE(waits);
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].kind, Command::Kind::kStop);
  EXPECT_EQ(sched_.operations().liveness_failed(sent[0].task_id, "again", 2, &waits).error().code,
            rpc::kConflict);  // stopping now
  // The budget (burst 2 in this fixture): a second goes, the third waits.
  EXPECT_TRUE(sched_.operations().liveness_failed(sent[1].task_id, "x", 2, &waits).ok());
  auto spent = sched_.operations().liveness_failed(sent[2].task_id, "x", 2, &waits);
  ASSERT_FALSE(spent.ok());
  EXPECT_EQ(spent.error().code, rpc::kUnavailable);

  JobSpec s = spec("kv", 1);
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  auto k = sched_.create(s, 100 * kMin);
  ASSERT_TRUE(k.ok());
  sent.insert(sent.end(), k->begin(), k->end());
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 100 * kMin + 1);
  const std::string kv = (*k)[0].task_id;
  r = sched_.operations().liveness_failed(kv, "stuck", 100 * kMin + 2, &waits);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_TRUE(waits);
  EXPECT_TRUE(r->empty());
  auto ops = sched_.operations().pending_operations("kv");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].kind, "restart");
  EXPECT_EQ(ops[0].reason, "liveness: stuck");
  // Said again while the controller has not answered: still the one operation.
  r = sched_.operations().liveness_failed(kv, "stuck", 100 * kMin + 3, &waits);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(waits);
  EXPECT_EQ(sched_.operations().pending_operations("kv").size(), 1u);
}

// Rollouts: a canary phase starts `canary` tasks of the new spec and holds until a
// promotion (by hand or after the canaries were ready for auto_promote); a paused
// rollout restarts nothing until resumed; every spec is a revision, the last ten kept.
TEST_F(Sched, CanariesHoldTheRolloutUntilPromotedAndAPauseHoldsIt) {
  JobSpec s = spec("web", 4);
  s.max_unavailable = 2;
  s.canary = 1;
  std::vector<Command> sent = create_running(s);
  auto of_gen = [&](uint64_t g) {
    int n = 0;
    for (const auto& t : sched_.tasks().of_job("web"))
      n += t.generation == g && (t.state == TaskState::kRunning || t.state == TaskState::kStarting);
    return n;
  };
  auto settle = [&](uint64_t now) {  // reports until nothing more is sent
    for (int i = 0; i < 10; ++i) {
      auto next = report_all(sent, now + static_cast<uint64_t>(i));
      if (next.empty()) break;
      sent.insert(sent.end(), next.begin(), next.end());
    }
  };
  s.task = {{"argv", {"/bin/sleep", "1000"}}};
  auto u = sched_.rollouts().update(s, 10);
  ASSERT_TRUE(u.ok());
  sent.insert(sent.end(), u->begin(), u->end());
  settle(11);
  EXPECT_EQ(of_gen(2), 1);  // one canary, however large max_unavailable
  EXPECT_EQ(of_gen(1), 3);
  EXPECT_TRUE(sched_.batch().progress("web")->canary);
  EXPECT_TRUE(sched_.tick(30).empty());  // no auto_promote: it holds
  auto p = sched_.rollouts().promote("web", 40, "promoted by alice");
  ASSERT_TRUE(p.ok());
  sent.insert(sent.end(), p->begin(), p->end());
  settle(41);
  EXPECT_EQ(of_gen(2), 4);
  EXPECT_FALSE(sched_.batch().progress("web")->canary);
  EXPECT_FALSE(sched_.rollouts().promote("web", 60, "again").ok());  // nothing waits

  // Paused: an update restarts nothing; resumed, it rolls.
  ASSERT_TRUE(sched_.rollouts().pause_rollout("web", true, 70).ok());
  s.canary = 0;
  s.task = {{"argv", {"/bin/sleep", "1001"}}};
  u = sched_.rollouts().update(s, 71);
  ASSERT_TRUE(u.ok());
  sent.insert(sent.end(), u->begin(), u->end());
  settle(72);
  EXPECT_EQ(of_gen(3), 0);
  EXPECT_TRUE(sched_.handover().persisted_job("web")->progress.paused);  // written with the job
  auto r = sched_.rollouts().pause_rollout("web", false, 80);
  ASSERT_TRUE(r.ok());
  sent.insert(sent.end(), r->begin(), r->end());
  settle(81);
  EXPECT_EQ(of_gen(3), 4);
  // The revisions: 1, 2 and 3, with their specs.
  auto revs = sched_.batch().progress("web")->revisions;
  ASSERT_EQ(revs.size(), 3u);
  EXPECT_EQ(revs[1].generation, 2u);
  EXPECT_EQ(revs[1].spec["task"]["argv"][1], "1000");
  for (int i = 0; i < 12; ++i) {
    s.task = {{"argv", {"/bin/sleep", std::to_string(2000 + i)}}};
    ASSERT_TRUE(sched_.rollouts().update(s, 100 + static_cast<uint64_t>(i)).ok());
  }
  revs = sched_.batch().progress("web")->revisions;
  ASSERT_EQ(revs.size(), kRevisionsKept);
  EXPECT_EQ(revs.back().generation, 15u);
  EXPECT_EQ(revs.front().generation, 6u);
}

TEST_F(Sched, CanariesReadyForAutoPromoteArePromoted) {
  JobSpec s = spec("web", 3);
  s.canary = 1;
  s.auto_promote_us = 10 * kMin;
  std::vector<Command> sent = create_running(s);
  s.task = {{"argv", {"/bin/sleep", "1000"}}};
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok());
  sent.insert(sent.end(), u->begin(), u->end());
  for (uint64_t t = 3; t < 8; ++t) {
    auto next = report_all(sent, t);
    sent.insert(sent.end(), next.begin(), next.end());
  }
  EXPECT_TRUE(sched_.batch().progress("web")->canary);
  EXPECT_TRUE(sched_.tick(kMin).empty());  // ready from now on
  EXPECT_TRUE(sched_.tick(5 * kMin).empty());
  auto promoted = sched_.tick(12 * kMin);
  EXPECT_FALSE(sched_.batch().progress("web")->canary);
  EXPECT_EQ(count_kind(promoted, Command::Kind::kStop), 1);  // max_unavailable 1: the next
}

// The job's events, in order: placed (on which machine), running, ready, failed with
// the machine's reason, and the operations asked with their reasons.
TEST_F(Sched, WhatHappensToTasksIsTakenAsEvents) {
  auto c = sched_.create(spec("web", 1), 0);
  ASSERT_TRUE(c.ok());
  const std::string id = (*c)[0].task_id;
  const MachineId m = (*c)[0].machine;
  sched_.report(m, {{id, TaskState::kRunning}}, 1);
  sched_.report(m, {{id, TaskState::kReady}}, 2);
  weft::TaskFailures why{{id, weft::TaskFailure{"exit status 3", false}}};
  sched_.report_list(m, weft::TaskList{{id, TaskState::kFailed}}, 3, nullptr, &why);
  std::vector<std::string> seen;
  for (const auto& e : sched_.take_events())
    if (e.task == id) seen.push_back(e.what + (e.detail.empty() ? "" : ": " + e.detail));
  EXPECT_EQ(seen, (std::vector<std::string>{"placed: " + alloc_.spec(m).name, "running", "ready",
                                            "failed: exit status 3"}));
  EXPECT_TRUE(sched_.take_events().empty());  // taken
}

TEST_F(Sched, AControlledScaleDownWaitsForTheControllersConsent) {
  JobSpec s = spec("web", 5);
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  std::vector<Command> sent = create_running(s);
  auto r = sched_.scale("web", 2, 2, /*through_controller=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());  // nothing stops before the controller says so
  EXPECT_EQ(sched_.job("web")->count, 5);
  EXPECT_EQ(sched_.target_count("web"), 2);
  auto ops = sched_.operations().pending_operations("web");
  ASSERT_EQ(ops.size(), 3u);
  for (const auto& op : ops) {
    EXPECT_EQ(op.kind, "stop");
    EXPECT_GE(op.index, 2);
    EXPECT_EQ(op.reason, "scale down from 5 to 2");
  }
  // One acknowledged: it stops, and its index is not started again when it has.
  auto g = sched_.operations().grant("web", {ops[0].id}, 3);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].kind, Command::Kind::kStop);
  EXPECT_EQ(g[0].task_id, ops[0].task);
  sent.insert(sent.end(), g.begin(), g.end());
  auto next = report_all(sent, 4);
  EXPECT_EQ(count_kind(next, Command::Kind::kStart), 0);
  EXPECT_EQ(sched_.operations().pending_operations("web").size(), 2u);
  EXPECT_EQ(sched_.job("web")->count, 5);
  // The rest acknowledged: the count is 2.
  g = sched_.operations().grant("web", {ops[1].id, ops[2].id}, 5);
  EXPECT_EQ(count_kind(g, Command::Kind::kStop), 2);
  EXPECT_EQ(count_kind(g, Command::Kind::kStart), 0);
  sent.insert(sent.end(), g.begin(), g.end());
  EXPECT_EQ(sched_.job("web")->count, 2);
  EXPECT_EQ(sched_.target_count("web"), 2);
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());
  next = report_all(sent, 6);
  EXPECT_EQ(count_kind(next, Command::Kind::kStart), 0);
  EXPECT_EQ(live("web").size(), 2u);

  // Again to 1, and the controller becomes unreachable: it stops at once.
  ASSERT_TRUE(sched_.scale("web", 1, 7, true).ok());
  EXPECT_EQ(sched_.operations().pending_operations("web").size(), 1u);
  auto f = sched_.operations().set_control_fallback("web", true, 8);
  EXPECT_EQ(count_kind(f, Command::Kind::kStop), 1);
  EXPECT_EQ(sched_.job("web")->count, 1);
  ASSERT_TRUE(sched_.operations().set_control_fallback("web", false, 9).empty());

  // A shrink waiting, then the operator's own scale: at once, and no shrink is left.
  ASSERT_TRUE(sched_.scale("web", 4, 10).ok());
  ASSERT_TRUE(sched_.scale("web", 2, 11, true).ok());
  EXPECT_EQ(sched_.target_count("web"), 2);
  auto op = sched_.scale("web", 3, 12);
  ASSERT_TRUE(op.ok());
  EXPECT_EQ(count_kind(*op, Command::Kind::kStop), 1);
  EXPECT_EQ(sched_.target_count("web"), 3);
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());
  // Without a controller, through_controller changes nothing: at once.
  ASSERT_TRUE(sched_.create(spec("plain", 3), 13).ok());
  auto plain = sched_.scale("plain", 1, 14, true);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(count_kind(*plain, Command::Kind::kStop), 2);
  EXPECT_EQ(sched_.job("plain")->count, 1);
}

// A drain of a machine running a controlled job's task waits for the controller's ack
// of the move; acked, the move is make-before-break as for any job; undrained before the
// ack, nothing moves; the controller unreachable, the move goes at once.
TEST_F(Sched, AControlledJobsTaskLeavesADrainedMachineWhenAcked) {
  JobSpec s = spec("web", 2);
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  auto c = sched_.create(s, 0);
  ASSERT_TRUE(c.ok());
  std::vector<Command> sent = *c;
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 1);
  MachineId drained = (*c)[0].machine;
  std::string task = (*c)[0].task_id;
  alloc_.set_usable(drained, false, true, true);  // what the broker does on a drain
  EXPECT_TRUE(sched_.moves().machine_drain(drained, 2).empty());
  auto ops = sched_.operations().pending_operations("web");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].id, "move/" + task);
  EXPECT_EQ(ops[0].kind, "move");
  EXPECT_EQ(sched_.tasks().at(task).state, TaskState::kRunning);
  // Undrained before any ack: not wanted any more.
  sched_.moves().machine_undrained(drained);
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());
  EXPECT_TRUE(sched_.operations().grant("web", {"move/" + task}, 3).empty());
  // Drained again, acked: a copy starts elsewhere; the old one stops once it runs.
  EXPECT_TRUE(sched_.moves().machine_drain(drained, 4).empty());
  auto g = sched_.operations().grant("web", {"move/" + task}, 5);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].kind, Command::Kind::kStart);
  EXPECT_NE(g[0].machine, drained);
  EXPECT_EQ(sched_.tasks().at(task).state, TaskState::kDraining);
  sent.insert(sent.end(), g.begin(), g.end());
  std::vector<Command> stops = report_all(sent, 6);
  ASSERT_EQ(count_kind(stops, Command::Kind::kStop), 1);
  EXPECT_EQ(stops[0].task_id, task);
  sent.insert(sent.end(), stops.begin(), stops.end());
  for (MachineId m : ids_) sched_.report(m, running_on(m, sent), 7);
  EXPECT_EQ(sched_.operations().take_completed("web"), std::vector<std::string>{"move/" + task});
  // The other task's machine drained while the controller is unreachable: moved at once.
  MachineId other = (*c)[1].machine;
  alloc_.set_usable(other, false, true, true);
  EXPECT_TRUE(sched_.moves().machine_drain(other, 8).empty());
  auto f = sched_.operations().set_control_fallback("web", true, 9);
  EXPECT_EQ(count_kind(f, Command::Kind::kStart), 1);
  EXPECT_TRUE(sched_.operations().pending_operations("web").empty());
}

// A machine drained while the task on it is being stopped by an update: the new
// generation of that index starts on another machine, not on the drained one (where it
// would wait forever).
TEST_F(Sched, AnUpdateOverlappingADrainStartsTheNewTaskElsewhere) {
  JobSpec s = spec("web", 2);
  std::vector<Command> sent = create_running(s);
  s.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched_.rollouts().update(s, 2);
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->size(), 1u);  // index 0 stops first
  MachineId m0 = (*u)[0].machine;
  sent.insert(sent.end(), u->begin(), u->end());
  alloc_.set_usable(m0, false, true, true);
  sched_.placer().set_ready_check([&](MachineId m) { return m != m0; });
  EXPECT_TRUE(sched_.moves().machine_drain(m0, 3).empty());  // stopping: nothing to move now
  std::vector<Command> next = report_all(sent, 4);
  ASSERT_EQ(count_kind(next, Command::Kind::kStart), 1);
  for (const auto& cmd : next) {
    if (cmd.kind == Command::Kind::kStart) {
      EXPECT_NE(cmd.machine, m0);
    }
  }
}

// The other order, for a job with a controller: the drain comes first (its move waits for
// the controller), then the controller acknowledges the update's restart of that task:
// the new task starts on another machine, not on the drained one.
TEST_F(Sched, AControlledRestartOnADrainedMachineStartsTheNewTaskElsewhere) {
  JobSpec s = spec("web", 2);
  s.controller = weft::TaskControllerSpec{"127.0.0.1:7400"};
  std::vector<Command> sent = create_running(s);
  MachineId m0 = live("web")[0].machine;
  std::string t0 = live("web")[0].id;
  alloc_.set_usable(m0, false, true, true);
  sched_.placer().set_ready_check([&](MachineId m) { return m != m0; });
  EXPECT_TRUE(sched_.moves().machine_drain(m0, 2).empty());  // the move waits for the controller
  s.task["argv"] = {"/bin/sleep", "1000"};
  auto u = sched_.rollouts().update(s, 3);
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->empty());  // restarts wait for the controller too
  auto g = sched_.operations().grant("web", {"restart/" + t0}, 4);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].kind, Command::Kind::kStop);
  sent.insert(sent.end(), g.begin(), g.end());
  std::vector<Command> next = report_all(sent, 5);
  ASSERT_EQ(count_kind(next, Command::Kind::kStart), 1);
  for (const auto& cmd : next) {
    if (cmd.kind == Command::Kind::kStart) {
      EXPECT_NE(cmd.machine, m0);
    }
  }
}

}  // namespace
}  // namespace weft::cp

namespace weft::cp {
namespace {

// Issue 43 (2): a task carries the entitlement its job was in, through reports and after
// it is let go, whatever job takes its job's name later.
TEST_F(Sched, ATaskKeepsTheEntitlementItRanIn) {
  auto c = sched_.create(spec("pay", 1), 0);
  ASSERT_TRUE(c.ok()) << c.error().str();
  ASSERT_EQ(c->size(), 1u);
  std::string id = (*c)[0].task_id;
  ASSERT_EQ(sched_.tasks().at(id).entitlement, 1u);
  report_all(*c, 1'000'000);
  EXPECT_EQ(sched_.tasks().at(id).entitlement, 1u);
  sched_.abandon("pay");
  auto gone = sched_.tasks().erased_on(id);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->entitlement, 1u);
}

}  // namespace
}  // namespace weft::cp
