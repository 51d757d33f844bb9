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
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "common/etcd.h"
#include "common/etcd_test_server.h"
#include "common/fs.h"
#include "common/rpc.h"

namespace weft {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A machine's session as the control plane sees it (like process_test.cc's, with the
// replica search a machine daemon's link makes: every socket in turn, a follower's
// "not the leader" moves on).
class Machine {
 public:
  explicit Machine(std::string id) : id_(std::move(id)) {
    methods_.add("task.run", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::string name = p["name"].get<std::string>();
      if (running_.count(name)) return make_error("exists").with_code(rpc::kConflict);
      running_.insert(name);
      ++starts_;
      return json{{"id", name}};
    });
    methods_.add("task.stop", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      running_.erase(p["id"].get<std::string>());
      return json::object();
    });
  }
  // Registers with whichever of `socks` leads; false when none does.
  bool connect(const std::vector<std::string>& socks) {
    for (const auto& s : socks) {
      auto c = rpc::Client::connect(s);
      if (!c.ok()) continue;
      (*c)->set_dispatcher(&methods_);
      auto r = (*c)->call("machine.register",
                          {{"machine", id_},
                           {"dc", "dc1"},
                           {"domain", "r-" + id_},
                           {"type", "std"},
                           {"cpu_milli", 4000},
                           {"mem_mb", 8192},
                           {"boot_id", boot_}},
                          3000);
      if (!r.ok()) {
        last_error_ = r.error();
        continue;
      }
      if (!(*c)->call("health.report", {{"machine", id_}, {"verdict", "ok"}}, 3000).ok()) continue;
      client_ = std::move(c).value();
      return true;
    }
    return false;
  }
  // One report; a lost session is dropped (reconnect with connect()).
  bool report() {
    if (!client_) return false;
    json tasks = json::object();
    for (const auto& t : running_) tasks[t] = "running";
    auto r = client_->call("machine.report", {{"machine", id_}, {"tasks", tasks}}, 3000);
    if (!r.ok()) client_.reset();
    return r.ok();
  }
  bool connected() const { return client_ != nullptr; }
  const std::set<std::string>& running() const { return running_; }
  int starts() const { return starts_; }
  const Error& last_error() const { return last_error_; }

 private:
  std::string id_, boot_ = random_hex(8);
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Client> client_;
  std::set<std::string> running_;
  int starts_ = 0;
  Error last_error_;
};

class Replica {
 public:
  Replica(const std::string& dir, const std::string& name, const std::string& etcd) {
    dir_ = dir + "/" + name;
    EXPECT_TRUE(mkdir_p(dir_).ok());
    port_ = weft::testing::free_tcp_port();
    EXPECT_TRUE(write_file(dir_ + "/cp.toml",
                           "socket = \"" + dir_ + "/cp.sock\"\nstate_dir = \"" + dir_ +
                               "/state\"\nlisten = \"127.0.0.1:" + std::to_string(port_) +
                               "\"\nheartbeat_interval = \"200ms\"\nmissed_heartbeats = 5\n"
                               "log_level = \"debug\"\nmetrics_listen = \"\"\n"
                               "[store]\nkind = \"etcd\"\netcd_endpoints = [\"" +
                               etcd + "\"]\netcd_prefix = \"/replicas/\"\nlease_ttl = \"2s\"\n")
                    .ok());
  }
  ~Replica() { stop(SIGKILL); }
  void start() {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open((dir_ + "/cp.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(WEFT_CONTROLPLANE_BIN, "weft-controlplane", "-c", (dir_ + "/cp.toml").c_str(), nullptr);
      _exit(127);
    }
  }
  // The exit status once it ended by itself (-1 while it runs).
  int exited() {
    if (pid_ <= 0) return status_;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) != pid_) return -1;
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }
  void stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    if (sig == SIGSTOP || sig == SIGCONT) return;
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  Result<json> call(const std::string& m, const json& p = json::object()) {
    TRY_ASSIGN(auto c, rpc::Client::connect(sock()));
    return c->call(m, p, 3000);
  }
  bool leading() {
    auto s = call("controlplane.status");
    return s.ok() && s->value("leading", false);
  }
  std::string sock() const { return dir_ + "/cp.sock"; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return read_file(dir_ + "/cp.log").value_or(""); }

 private:
  std::string dir_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
  int status_ = -1;
};

class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-replicas-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    a_ = std::make_unique<Replica>(dir_, "a", etcd_->endpoint());
    b_ = std::make_unique<Replica>(dir_, "b", etcd_->endpoint());
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    etcd_.reset();
    (void)remove_tree(dir_);
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
  std::vector<std::string> socks() const { return {a_->sock(), b_->sock()}; }
  // One round: every machine reports (reconnecting to the leader if its session is
  // gone). Fails the test if an index of the job runs twice in one generation or a task
  // runs on two machines.
  void round(std::vector<std::unique_ptr<Machine>>& ms) {
    std::map<std::string, int> copies;
    for (auto& m : ms) {
      if (!m->connected()) m->connect(socks());
      m->report();
      for (const auto& t : m->running()) ++copies[t];
    }
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
  for (int i = 0; i < 200; ++i) {
    auto st = b_->call("controlplane.status");
    if (st.ok() && st->value("leader", "") == a_->address()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto st = b_->call("controlplane.status");
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
  for (int i = 0; i < 200; ++i) {
    auto s = a_->call("controlplane.status");
    if (s.ok() && s->value("leader", "") == b_->address()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto again = a_->call("controlplane.status");
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

}  // namespace
}  // namespace weft
