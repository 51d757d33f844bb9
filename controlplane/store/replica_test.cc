// Control plane replicas on a real etcd (Debian's etcd-server, started by the test on
// loopback): two weft-controlplane processes, one leading; fake machines on the
// leader's socket. The leader is SIGKILLed in the middle of a rolling update, and
// another is frozen (SIGSTOP) past its lease and woken: the follower takes over, the
// update completes, no task restarts, no index ever runs twice, and a deposed leader
// writes nothing and stops.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "controlplane/store/etcd_client.h"
#include "testing/chaos.h"
#include "testing/etcd_server.h"
#include "testing/replica_harness.h"

namespace weft {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using weft::testing::Machine;
using weft::testing::Replica;

class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-replicas-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    a_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "a", etcd_->client_config());
    b_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "b", etcd_->client_config());
  }
  void TearDown() override {
    // A failure shows what the replicas said (their logs go with the directory).
    if (HasFailure())
      for (Replica* r : {a_.get(), b_.get()})
        if (r) std::cerr << "---- " << r->sock() << "'s log (tail):\n" << tail(r->log()) << "\n";
    a_.reset();
    b_.reset();
    etcd_.reset();
    (void)remove_tree(dir_);
  }
  static std::string tail(const std::string& s, size_t max = 12000) {
    return s.size() <= max ? s : s.substr(s.size() - max);
  }
  // Waits until `r` leads; false after `seconds`.
  static bool wait_leading(Replica& r, double seconds) {
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (r.leading()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Waits (at most 4 s) until `r` answers as a follower that names `leader`; its last
  // controlplane.status answer.
  static Result<json> wait_following(Replica& r, const Replica& leader) {
    for (int i = 0; i < 200; ++i) {
      auto st = r.call("controlplane.status");
      if (st.ok() && st->value("leader", "") == leader.address()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return r.call("controlplane.status");
  }
  std::vector<std::string> socks() const { return {a_->sock(), b_->sock()}; }
  // One round: every machine the test drives reports (reconnecting to the leader if its
  // session is gone; those with their own thread report by themselves). Fails the test
  // if an index of the job runs twice in one generation or a task runs on two machines,
  // as seen at one moment on every machine.
  void round(std::vector<std::unique_ptr<Machine>>& ms) {
    for (auto& m : ms) {
      if (m->reporting()) continue;
      if (!m->connected()) m->connect(socks());
      m->report();
    }
    std::map<std::string, int> copies;
    auto world = Machine::snapshot();
    for (auto& m : ms)
      for (const auto& t : m->running()) ++copies[t];
    std::map<std::string, int> per_index;  // "<index>.<generation>"
    for (const auto& [id, n] : copies) {
      EXPECT_EQ(n, 1) << id << " runs on two machines";
      size_t last = id.rfind('.');
      size_t mid = id.rfind('.', last - 1);
      (void)mid;
      ++per_index[id.substr(0, last)];
    }
    for (const auto& [index, n] : per_index) EXPECT_EQ(n, 1) << "two copies of " << index;
  }
  std::string dir_;
  std::unique_ptr<weft::testing::EtcdServer> etcd_;
  std::unique_ptr<Replica> a_, b_;
};

int running_of_generation(const json& show, uint64_t gen) {
  int n = 0;
  for (const auto& t : show["tasks"])
    n += t["state"] == "running" && t["generation"].get<uint64_t>() == gen;
  return n;
}

TEST_F(Replicas, TheLeaderKilledMidUpdateIsReplacedAndTheUpdateCompletes) {
  a_->start();
  ASSERT_TRUE(wait_leading(*a_, 10)) << a_->log();
  b_->start();
  // The follower answers, and names the leader; every other call is refused.
  auto st = wait_following(*b_, *a_);
  ASSERT_TRUE(st.ok()) << b_->log();
  EXPECT_FALSE(st->value("leading", true));
  EXPECT_EQ(st->value("leader", ""), a_->address());
  auto refused = b_->call("job.ls");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, rpc::kNotLeader);
  EXPECT_EQ(refused.error().leader, a_->address());

  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 4; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ASSERT_TRUE(ms.back()->connect(socks())) << ms.back()->last_error().str();
  }
  ASSERT_TRUE(a_->call("entitlement.create", {{"name", "web"}, {"quota", 4}}).ok());
  json job{{"name", "site"},
           {"entitlement", "web"},
           {"count", 3},
           {"max_unavailable", 1},
           {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  ASSERT_TRUE(a_->call("job.create", job).ok());
  for (int i = 0; i < 100; ++i) {
    round(ms);
    auto show = a_->call("job.show", {{"name", "site"}});
    if (show.ok() && running_of_generation(*show, 1) == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(running_of_generation(*a_->call("job.show", {{"name", "site"}}), 1), 3);

  // The job's events so far: the update's acknowledgement below says they are kept with
  // it (notes in etcd).
  auto events = a_->call("job.events", {{"name", "site"}, {"limit", 1000}});
  ASSERT_TRUE(events.ok()) << events.error().str();
  ASSERT_FALSE((*events)["events"].empty());
  // A rolling update, one task at a time; the leader dies once the first new task runs.
  job["task"]["argv"] = {"/bin/sleep", "1000000"};
  ASSERT_TRUE(a_->call("job.update", job).ok());
  for (int i = 0; i < 200; ++i) {
    round(ms);
    auto show = a_->call("job.show", {{"name", "site"}});
    if (show.ok() && running_of_generation(*show, 2) >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int starts_before = 0;
  for (auto& m : ms) starts_before += m->starts();
  auto killed = Clock::now();
  a_->stop(SIGKILL);
  ASSERT_TRUE(wait_leading(*b_, 10)) << b_->log();
  double failover_s = std::chrono::duration<double>(Clock::now() - killed).count();
  RecordProperty("failover_ms", static_cast<int>(failover_s * 1000));
  EXPECT_LT(failover_s, 2.0 + 1.5) << "the lease TTL is 2 s";

  // The machines find the new leader; the update goes on and completes there.
  bool done = false;
  for (int i = 0; i < 500 && !done; ++i) {
    round(ms);
    auto show = b_->call("job.show", {{"name", "site"}});
    done =
        show.ok() && running_of_generation(*show, 2) == 3 && running_of_generation(*show, 1) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(done) << b_->call("job.show", {{"name", "site"}})->dump() << b_->log();
  // The new leader shows the events the old one recorded, under the same numbers.
  auto shown = b_->call("job.events", {{"name", "site"}, {"limit", 1000}});
  ASSERT_TRUE(shown.ok()) << shown.error().str();
  ASSERT_GE((*shown)["events"].size(), (*events)["events"].size());
  for (size_t i = 0; i < (*events)["events"].size(); ++i)
    EXPECT_EQ((*shown)["events"][i], (*events)["events"][i]) << i;
  for (int i = 0; i < 10; ++i) round(ms);
  int starts_after = 0, running = 0;
  for (auto& m : ms) {
    starts_after += m->starts();
    running += static_cast<int>(m->running().size());
  }
  EXPECT_EQ(running, 3);
  // Every start after the failover is one of the update's: 3 new tasks in all, no
  // restart of a task the first leader had started.
  int new_before = starts_before - 3;
  EXPECT_EQ(starts_after - starts_before, 3 - new_before);

  // The old leader comes back as a follower of the new one.
  a_->start();
  auto again = wait_following(*a_, *b_);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->value("leading", true));
  EXPECT_EQ(again->value("leader", ""), b_->address());
}

// A leader frozen past its lease (a long pause, a partition from etcd) while a follower
// takes over: woken, it must not act on what it held. It stops (exit 1), and nothing it
// would have written is in etcd.
TEST_F(Replicas, AFrozenLeaderWokenAfterItsLeaseStopsAndWritesNothing) {
  a_->start();
  ASSERT_TRUE(wait_leading(*a_, 10)) << a_->log();
  b_->start();
  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 2; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ASSERT_TRUE(ms.back()->connect({a_->sock()}));
  }
  ASSERT_TRUE(a_->call("entitlement.create", {{"name", "web"}, {"quota", 2}}).ok());
  // A request queued on the frozen leader's socket: a job it will read when woken.
  a_->stop(SIGSTOP);
  std::thread late([&] {
    (void)a_->call("job.create", {{"name", "late"},
                                  {"entitlement", "web"},
                                  {"count", 1},
                                  {"per_task", {{"cpu_milli", 100}, {"mem_mb", 64}}},
                                  {"task", {{"argv", {"/bin/true"}}}}});
  });
  ASSERT_TRUE(wait_leading(*b_, 10)) << b_->log();
  a_->stop(SIGCONT);
  late.join();
  int code = -1;
  for (int i = 0; i < 300 && (code = a_->exited()) < 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(code, 1) << a_->log();
  EXPECT_NE(a_->log().find("no longer leads"), std::string::npos);
  auto jobs = b_->call("job.ls");
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE((*jobs)["jobs"].empty()) << jobs->dump();
  auto client = etcd::Client::create({{etcd_->endpoint()}, {}, {}, {}, 2000});
  ASSERT_TRUE(client.ok());
  auto rows = (*client)->range_prefix("/replicas/state/jobs/");
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->empty());
  // The entitlement written before the freeze is there for the new leader.
  auto ents = b_->call("entitlement.ls");
  ASSERT_TRUE(ents.ok());
  EXPECT_NE(ents->dump().find("web"), std::string::npos) << ents->dump();
}

// Issue 48: a periodic job's runs across a failover. The leader is killed; the new one
// carries on after the last period written, and runs the periods it missed meanwhile:
// every period has exactly one run, started once, none skipped.
TEST_F(Replicas, APeriodicJobRunsEachPeriodOnceAcrossAFailover) {
  a_->start();
  ASSERT_TRUE(wait_leading(*a_, 10)) << a_->log();
  b_->start();
  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 2; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ASSERT_TRUE(ms.back()->connect(socks()));
  }
  ASSERT_TRUE(a_->call("entitlement.create", {{"name", "web"}, {"quota", 2}}).ok());
  json job{{"name", "tick"},
           {"entitlement", "web"},
           {"kind", "batch"},
           {"periodic", {{"schedule", "*/2 * * * * *"}}},
           {"per_task", {{"cpu_milli", 10}, {"mem_mb", 1}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  auto created = a_->call("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  auto runs = [&] {
    std::map<std::string, int> out;  // run -> tasks started for it
    for (auto& m : ms)
      for (const auto& id : m->started())
        if (id.rfind("tick-", 0) == 0) ++out[id.substr(0, id.find('.'))];
    return out;
  };
  for (int i = 0; i < 60 && runs().size() < 2; ++i) {
    round(ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(runs().size(), 2u) << a_->log();
  a_->stop(SIGKILL);
  ASSERT_TRUE(wait_leading(*b_, 15)) << b_->log();
  size_t before = runs().size();
  for (int i = 0; i < 80 && runs().size() < before + 3; ++i) {
    round(ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto all = runs();
  ASSERT_GE(all.size(), before + 3) << b_->log();
  std::vector<int64_t> periods;
  for (const auto& [run, n] : all) {
    EXPECT_EQ(n, 1) << run << " started more than once";
    periods.push_back(std::stoll(run.substr(run.rfind('-') + 1)));
  }
  for (size_t i = 1; i < periods.size(); ++i)
    EXPECT_EQ(periods[i] - periods[i - 1], 2) << "a period was skipped: " << periods[i];
}

// etcd lost and back (its only member killed, restarted on its data): the leader cannot
// write meanwhile and stops; a replica leads again once etcd serves, with nothing lost.
TEST_F(Replicas, ServingStopsWithoutEtcdAndResumesWithoutLoss) {
  a_->start();
  ASSERT_TRUE(wait_leading(*a_, 10)) << a_->log();
  b_->start();
  for (int i = 0; i < 200 && !b_->call("controlplane.status").ok(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(a_->call("entitlement.create", {{"name", "web"}, {"quota", 2}}).ok());
  etcd_->kill();
  // The leader's lease cannot be kept: it stops acting within the TTL.
  int code = -1;
  for (int i = 0; i < 500 && (code = a_->exited()) < 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(code, 1) << a_->log();
  EXPECT_NE(a_->log().find("no longer leads"), std::string::npos);
  EXPECT_FALSE(b_->leading());
  etcd_->start();
  ASSERT_EQ(etcd_->error(), "");
  ASSERT_TRUE(wait_leading(*b_, 15)) << b_->log();
  auto ents = b_->call("entitlement.ls");
  ASSERT_TRUE(ents.ok());
  EXPECT_NE(ents->dump().find("web"), std::string::npos) << ents->dump();
}

// etcd as deployed: three members, TLS with client certificates. One member lost: the
// majority serves and so does the control plane. A second lost: no majority, no leader
// (the leader stops within its lease), machines keep running. Both back: a replica leads
// again, and nothing written before is lost.
TEST_F(Replicas, AThreeMemberEtcdOverTlsLosesOneThenAMajority) {
  std::string pki = dir_ + "/pki", tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
  ASSERT_EQ(
      std::system(("(" + tool + " ca " + pki + " && " + tool + " issue " + pki +
                   " etcd --ip 127.0.0.1 && " + tool + " issue " + pki + " client) >/dev/null")
                      .c_str()),
      0);
  a_.reset();
  b_.reset();
  etcd_ = std::make_unique<weft::testing::EtcdServer>(3, pki);
  ASSERT_EQ(etcd_->error(), "");
  // Without a client certificate, etcd refuses.
  etcd::Config anonymous = etcd_->client_config();
  anonymous.cert.clear();
  anonymous.key.clear();
  auto refused = etcd::Client::create(anonymous);
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE((*refused)->ping().ok());
  a_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "a", etcd_->client_config());
  b_ = std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, "b", etcd_->client_config());
  Replica* rs[2] = {a_.get(), b_.get()};
  auto leader = [&](double seconds) -> Replica* {
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      for (Replica* r : rs) {
        if (r->exited() >= 0) r->start();  // systemd
        if (r->leading()) return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return nullptr;
  };
  a_->start();
  b_->start();
  Replica* l = leader(15);
  ASSERT_NE(l, nullptr) << a_->log() << b_->log();
  ASSERT_TRUE(l->call("entitlement.create", {{"name", "web"}, {"quota", 2}}).ok());
  std::vector<std::unique_ptr<Machine>> ms;
  ms.push_back(std::make_unique<Machine>("m0"));
  ASSERT_TRUE(ms.back()->connect(socks()));
  ms.back()->start_reporting(socks());
  json job{{"name", "before"},
           {"entitlement", "web"},
           {"count", 1},
           {"per_task", {{"cpu_milli", 100}, {"mem_mb", 64}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  ASSERT_TRUE(l->call("job.create", job).ok());
  for (int i = 0; i < 200 && ms[0]->running().empty(); ++i) {
    round(ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ms[0]->running().size(), 1u);

  etcd_->kill(0);  // one of three: the other two are a majority
  l = leader(15);
  ASSERT_NE(l, nullptr) << a_->log() << b_->log();
  job["name"] = "during";
  Result<json> created = make_error("not tried");
  for (int i = 0; i < 50 && !created.ok(); ++i) {
    if ((l = leader(10)) != nullptr) created = l->call("job.create", job);
    // A create written, its answer lost with a leader that stepped down meanwhile (its
    // own etcd member was the one killed): the next leader has the job. Made, once.
    if (!created.ok() && created.error().code == rpc::kInvalidParams &&
        created.error().message.find("exists") != std::string::npos && l &&
        l->call("job.show", {{"name", "during"}}).ok())
      created = json::object();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(created.ok()) << created.error().str();
  // A leader whose etcd member died may lose its lease and hand over: the machine then
  // moves to the new leader (which gives it the failover grace rather than counting it
  // dead). Served on means both tasks run, given the time a handover takes on a loaded
  // machine.
  for (int i = 0; i < 750 && ms[0]->running().size() < 2; ++i) {
    round(ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ms[0]->running().size(), 2u);

  etcd_->kill(1);  // a majority lost: nothing may lead
  // The leader stops within its lease (plus a loaded machine's delays)...
  bool none = false;
  for (auto end = Clock::now() + std::chrono::seconds(10); !none && Clock::now() < end;) {
    none = true;
    for (Replica* r : rs) {
      if (r->exited() >= 0) r->start();
      none = none && !r->leading();
    }
    round(ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(none) << "a replica still leads without an etcd majority";
  // ...and none leads after it.
  for (int i = 0; i < 40; ++i) {
    for (Replica* r : rs) {
      if (r->exited() >= 0) r->start();
      EXPECT_FALSE(r->leading()) << "a replica leads without an etcd majority";
    }
    round(ms);  // the machine keeps its task, whoever answers
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(ms[0]->running().size(), 2u);

  etcd_->start();  // both back
  ASSERT_EQ(etcd_->error(), "");
  l = leader(20);
  ASSERT_NE(l, nullptr) << a_->log() << b_->log();
  auto jobs = l->call("job.ls");
  ASSERT_TRUE(jobs.ok());
  std::set<std::string> names;
  for (const auto& j : (*jobs)["jobs"]) names.insert(j.value("name", ""));
  EXPECT_EQ(names, (std::set<std::string>{"before", "during"})) << jobs->dump();
}

// Chaos, bounded (WEFT_CHAOS_SECONDS, 40 by default; longer on demand): random faults
// one after another, each healed as systemd and an operator would (an exited replica is
// started again): the leader SIGKILLed, a follower SIGKILLed, the leader frozen past its
// lease (SIGSTOP, as a partition from etcd looks to it), etcd killed and restarted, a
// machine's daemon restarting. Checked continuously: never two copies of a task index,
// no job lost; after each fault heals, every job back at its count within 10 s.
TEST_F(Replicas, ChaosKeepsEveryInvariant) {
  weft::testing::ChaosRun run = weft::testing::chaos_run();
  const double seconds = run.seconds;
  const uint64_t seed = run.seed;
  std::mt19937_64& rng = run.rng;
  a_->start();
  ASSERT_TRUE(wait_leading(*a_, 10)) << a_->log();
  b_->start();
  std::vector<std::unique_ptr<Machine>> ms;
  for (int i = 0; i < 5; ++i) {
    ms.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
    ASSERT_TRUE(ms.back()->connect(socks()));
    ms.back()->start_reporting(socks());
  }
  ASSERT_TRUE(a_->call("entitlement.create", {{"name", "web"}, {"quota", 5}}).ok());
  const int kJobs = 3, kCount = 2;
  for (int j = 0; j < kJobs; ++j)
    ASSERT_TRUE(a_->call("job.create", {{"name", "j" + std::to_string(j)},
                                        {"entitlement", "web"},
                                        {"count", kCount},
                                        {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
                                        {"task", {{"argv", {"/bin/sleep", "infinity"}}}}})
                    .ok());
  Replica* rs[2] = {a_.get(), b_.get()};
  auto leader = [&]() -> Replica* {
    for (Replica* r : rs)
      if (r->leading()) return r;
    return nullptr;
  };
  // One round of the world: exited replicas restarted (systemd), machines report, and
  // the invariants checked. True when every job runs its count.
  auto tick = [&] {
    for (Replica* r : rs)
      if (r->exited() >= 0) r->start();
    round(ms);
    Replica* l = leader();
    if (!l) return false;
    auto jobs = l->call("job.ls");
    if (!jobs.ok()) return false;
    EXPECT_EQ((*jobs)["jobs"].size(), static_cast<size_t>(kJobs)) << "a job was lost";
    int running = 0;
    for (auto& m : ms) running += static_cast<int>(m->running().size());
    return running == kJobs * kCount;
  };
  // What happened, for a failure's message: each fault and how long healing took.
  auto begun = Clock::now();
  std::string history;
  auto note = [&](const std::string& what) {
    char at[32];
    std::snprintf(at, sizeof at, "%8.2f s  ",
                  std::chrono::duration<double>(Clock::now() - begun).count());
    history += at + what + "\n";
  };
  auto settle = [&](const char* after) {
    auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::seconds(10)) {
      if (tick()) {
        note(std::string("  back at every count after ") +
             std::to_string(
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()) +
             " ms");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "not back at every job's count 10 s after: " << after << " (seed " << seed
                  << ")\nfaults:\n"
                  << history << "replica a:\n"
                  << a_->log() << "\nreplica b:\n"
                  << b_->log();
  };
  auto run_for = [&](double s) {
    auto end = Clock::now() + std::chrono::duration<double>(s);
    while (Clock::now() < end) {
      tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  settle("the start");
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int faults = 0;
  while (Clock::now() < deadline && !HasFailure()) {
    std::uniform_real_distribution<double> pause(0.2, 1.5);
    int kind = static_cast<int>(rng() % 5);
    Replica* l = leader();
    Replica* f = l == a_.get() ? b_.get() : a_.get();
    const char* what = "";
    switch (kind) {
      case 0:
        what = "the leader killed";
        if (l) l->stop(SIGKILL);
        run_for(pause(rng));
        break;
      case 1:
        what = "a follower killed";
        f->stop(SIGKILL);
        run_for(pause(rng));
        break;
      case 2:
        what = "the leader frozen past its lease";
        if (l) {
          l->stop(SIGSTOP);
          run_for(2.5 + pause(rng));
          l->stop(SIGCONT);
        }
        break;
      case 3:
        what = "etcd killed and restarted";
        etcd_->kill();
        run_for(pause(rng) * 2);
        etcd_->start();
        ASSERT_EQ(etcd_->error(), "");
        break;
      case 4: {
        what = "a machine's daemon restarted";
        auto& m = ms[rng() % ms.size()];
        m->disconnect();
        run_for(0.3);  // back before it is declared dead (5 x 200 ms)
        break;
      }
    }
    ++faults;
    note(std::string(what) + " (healed)");
    settle(what);
  }
  RecordProperty("faults", faults);
  if (HasFailure())
    std::fprintf(stderr, "seed %llu, faults:\n%s", static_cast<unsigned long long>(seed),
                 history.c_str());
  EXPECT_GE(faults, 3);
}

}  // namespace
}  // namespace weft
