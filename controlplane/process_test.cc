// weft-controlplane as a process, with fake machines on its socket: machines register
// and report, a job is placed across them and started through their sessions, a machine
// that stops heart-beating has its task replaced elsewhere, the control plane is
// SIGKILLed and restarted without restarting any task, and the machine that comes back
// is told to stop its stale copy.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <filesystem>
#include <set>
#include <thread>

#include "common/fs.h"
#include "common/rpc.h"

namespace weft {
namespace {

using json = nlohmann::json;

// A machine as the control plane sees it: a session that registers, reports its tasks,
// and runs/stops what it is told.
class FakeMachine {
 public:
  FakeMachine(std::string id, std::string rack) : id_(std::move(id)), rack_(std::move(rack)) {
    methods_.add("task.run", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      running_.insert(p["name"].get<std::string>());
      ++starts_;
      return json{{"id", p["name"]}};
    });
    methods_.add("task.stop", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      running_.erase(p["id"].get<std::string>());
      ++stops_;
      return json::object();
    });
  }
  bool connect(const std::string& sock) {
    auto c = rpc::Client::connect(sock);
    if (!c.ok()) return false;
    client_ = std::move(c).value();
    client_->set_dispatcher(&methods_);
    auto r = client_->call("machine.register", {{"machine", id_},
                                                {"dc", "dc1"},
                                                {"domain", rack_},
                                                {"type", "std"},
                                                {"cpu_milli", 4000},
                                                {"mem_mb", 8192}});
    if (!r.ok()) return false;
    return client_->call("health.report", {{"machine", id_}, {"verdict", "ok"}}).ok();
  }
  void report() {
    json tasks = json::object();
    for (const auto& t : running_) tasks[t] = "running";
    (void)client_->call("machine.report", {{"machine", id_}, {"tasks", tasks}});
  }
  void disconnect() { client_.reset(); }
  const std::set<std::string>& running() const { return running_; }
  int starts() const { return starts_; }
  int stops() const { return stops_; }

 private:
  std::string id_, rack_;
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Client> client_;
  std::set<std::string> running_;
  int starts_ = 0, stops_ = 0;
};

class ControlPlane : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-cp-test-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    ASSERT_TRUE(write_file(dir_ + "/cp.toml", "socket = \"" + dir_ + "/cp.sock\"\nstate_dir = \"" +
                                                  dir_ +
                                                  "/state\"\nlisten = \"\"\n"
                                                  "heartbeat_interval = \"200ms\"\n"
                                                  "missed_heartbeats = 3\nlog_level = \"debug\"\n")
                    .ok());
  }
  void TearDown() override {
    stop(SIGTERM);
    (void)remove_tree(dir_);
  }
  void start() {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open((dir_ + "/cp.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(WEFT_CONTROLPLANE_BIN, "weft-controlplane", "-c", (dir_ + "/cp.toml").c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {
      if (call("job.ls").ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "weft-controlplane did not start: " << read_file(dir_ + "/cp.log").value_or("");
  }
  void stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int st = 0;
    waitpid(pid_, &st, 0);
    if (sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    }
    pid_ = -1;
  }
  Result<json> call(const std::string& m, const json& p = json::object()) {
    TRY_ASSIGN(auto c, rpc::Client::connect(dir_ + "/cp.sock"));
    return c->call(m, p, 5000);
  }
  std::string sock() const { return dir_ + "/cp.sock"; }
  std::string dir_;
  pid_t pid_ = -1;
};

TEST_F(ControlPlane, PlaceReplaceRestartWithoutRestartingTasks) {
  start();
  if (HasFatalFailure()) return;
  std::vector<std::unique_ptr<FakeMachine>> ms;
  for (int i = 0; i < 3; ++i) {
    ms.push_back(
        std::make_unique<FakeMachine>("host" + std::to_string(i), "rack" + std::to_string(i)));
    ASSERT_TRUE(ms.back()->connect(sock()));
    ms.back()->report();
  }
  ASSERT_TRUE(call("entitlement.create", {{"name", "web"}, {"quota", 3}}).ok());
  auto bad = call("job.create", {{"name", "site"}, {"count", 0}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("count"), std::string::npos) << bad.error().str();
  auto created = call("job.create", {{"name", "site"},
                                     {"entitlement", 1},
                                     {"count", 3},
                                     {"per_task", {{"cpu_milli", 1000}, {"mem_mb", 512}}},
                                     {"task", {{"argv", {"/bin/sleep", "infinity"}}}}});
  ASSERT_TRUE(created.ok()) << created.error().str();
  // Each machine gets one task (spread across racks) through its session.
  for (int round = 0; round < 50; ++round) {
    for (auto& m : ms) m->report();
    bool all = true;
    for (auto& m : ms) all &= m->running().size() == 1;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& m : ms) ASSERT_EQ(m->running().size(), 1u);
  for (auto& m : ms) m->report();
  auto show = call("job.show", {{"name", "site"}});
  ASSERT_TRUE(show.ok());
  for (const auto& t : (*show)["tasks"]) EXPECT_EQ(t["state"], "running") << show->dump();

  // host1 goes silent: dead after 3 missed heartbeats, its task replaced on another.
  std::string lost = *ms[1]->running().begin();
  ms[1]->disconnect();
  int replaced_on = -1;
  for (int round = 0; round < 100 && replaced_on < 0; ++round) {
    for (int i : {0, 2}) {
      ms[static_cast<size_t>(i)]->report();
      if (ms[static_cast<size_t>(i)]->running().size() == 2) replaced_on = i;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(replaced_on, 0) << read_file(dir_ + "/cp.log").value_or("");
  for (int i : {0, 2}) ms[static_cast<size_t>(i)]->report();

  // SIGKILL and restart: the state is back, and reporting machines get no new starts.
  int starts_before = ms[0]->starts() + ms[2]->starts();
  stop(SIGKILL);
  start();
  if (HasFatalFailure()) return;
  auto again = call("job.show", {{"name", "site"}});
  ASSERT_TRUE(again.ok());
  int running = 0, lost_n = 0;
  for (const auto& t : (*again)["tasks"]) {
    running += t["state"] == "running";
    lost_n += t["state"] == "lost";
  }
  EXPECT_EQ(running, 3) << again->dump();
  EXPECT_EQ(lost_n, 1) << again->dump();
  for (int i : {0, 2}) {
    ASSERT_TRUE(ms[static_cast<size_t>(i)]->connect(sock()));
    for (int k = 0; k < 5; ++k) ms[static_cast<size_t>(i)]->report();
  }
  EXPECT_EQ(ms[0]->starts() + ms[2]->starts(), starts_before);
  EXPECT_EQ(ms[0]->running().size() + ms[2]->running().size(), 3u);

  // host1 comes back still running its old copy: it is told to stop it (never twice).
  ASSERT_TRUE(ms[1]->connect(sock()));
  for (int k = 0; k < 5 && ms[1]->running().count(lost); ++k) ms[1]->report();
  EXPECT_FALSE(ms[1]->running().count(lost));
  EXPECT_EQ(ms[1]->stops(), 1);

  // Operator calls over a machine's session are refused unless privileged; stopping the
  // job stops every task and removes it.
  ASSERT_TRUE(call("job.stop", {{"name", "site"}}).ok());
  for (int k = 0; k < 5; ++k)
    for (auto& m : ms) m->report();
  for (auto& m : ms) EXPECT_TRUE(m->running().empty());
  auto ls = call("job.ls");
  ASSERT_TRUE(ls.ok());
  EXPECT_TRUE((*ls)["jobs"].empty()) << ls->dump();
  auto machines = call("machine.ls");
  ASSERT_TRUE(machines.ok());
  EXPECT_EQ((*machines)["machines"].size(), 3u);
}

}  // namespace
}  // namespace weft
