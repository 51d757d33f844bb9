// weft-controlplane as a process with TaskControllers (docs/taskcontrol.md): a fake
// controller and the reference shard controller, over rolling updates, drains and
// planned maintenance.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <random>
#include <sstream>

#include "common/toml.h"

#include "common/fs.h"
#include "common/job_file.h"
#include "common/job_spec.h"

#include "common/services.h"
#include "common/task_report.h"
#include "common/task_spec.h"
#include "common/tls.h"
#include "examples/shard_controller/shard_manager.h"
#include "testing/cp_process.h"
#include "testing/fake_machine.h"
#include "testing/process.h"
#include "testing/registry_server.h"

// In weft::testing: the fixture, the fake machine and spawn_process are its own.
namespace weft::testing {
namespace {

// A controller's policy: every pending operation of `kind`, once `consent` is set (which
// must outlive the controller that holds the policy).
std::function<json(const json&)> consent_to(const std::atomic<bool>& consent, std::string kind) {
  return [&consent, kind](const json& plan) {
    json ack = json::array();
    if (consent)
      for (const auto& op : plan.value("pending", json::array()))
        if (op["kind"] == kind) ack.push_back(op["op"]);
    return ack;
  };
}

// A TaskController on loopback TCP, in a thread of the test: answers every
// taskcontrol.plan with the ids its policy picks, and keeps the plans it was sent.
class FakeController {
 public:
  using Policy = std::function<json(const json& plan)>;  // -> the "ack" list
  FakeController() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_, 8) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeController() { stop(); }
  uint16_t port() const { return port_; }
  void set_policy(Policy p) {
    std::lock_guard<std::mutex> g(mu_);
    policy_ = std::move(p);
  }
  std::vector<json> plans() {
    std::lock_guard<std::mutex> g(mu_);
    return plans_;
  }
  // Gone: the listener and every session closed (connects are refused from now on).
  void stop() {
    if (stopping_.exchange(true)) return;
    if (thread_.joinable()) thread_.join();
    if (listen_ >= 0) ::close(listen_);
    listen_ = -1;
  }

 private:
  void serve() {
    std::vector<pollfd> fds{{listen_, POLLIN, 0}};
    std::map<int, std::string> buf;
    while (!stopping_) {
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) fds.push_back({c, POLLIN, 0});
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char chunk[65536];
        ssize_t n = ::read(fds[i].fd, chunk, sizeof chunk);
        if (n <= 0) {
          ::close(fds[i].fd);
          buf.erase(fds[i].fd);
          fds[i].fd = -1;
          continue;
        }
        std::string& b = buf[fds[i].fd];
        b.append(chunk, static_cast<size_t>(n));
        for (size_t nl; (nl = b.find('\n')) != std::string::npos;) {
          json msg = json::parse(b.substr(0, nl), nullptr, false);
          b.erase(0, nl + 1);
          if (!msg.is_object() || msg.value("method", "") != "taskcontrol.plan") continue;
          json ack = json::array();
          {
            std::lock_guard<std::mutex> g(mu_);
            plans_.push_back(msg["params"]);
            if (policy_) ack = policy_(msg["params"]);
          }
          std::string out = json{{"jsonrpc", "2.0"},
                                 {"id", msg["id"]},
                                 {"result", {{"seq", msg["params"]["seq"]}, {"ack", ack}}}}
                                .dump() +
                            "\n";
          (void)!::write(fds[i].fd, out.data(), out.size());
        }
      }
      std::erase_if(fds, [](const pollfd& p) { return p.fd < 0; });
    }
    for (size_t i = 1; i < fds.size(); ++i) ::close(fds[i].fd);
  }
  int listen_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  Policy policy_;
  std::vector<json> plans_;
};

// TaskControl through the daemon: a rolling update of a job with a controller restarts
// only what the controller acknowledges, tells it what completed, and, when the
// controller is gone past its timeout, goes on at max_unavailable pacing.
// Autoscaling's scale-down of a job with a TaskController: the tasks above the new size
// are pending `stop` operations, nothing stops until the controller acknowledges them,
// and then exactly those stop and the size follows (docs/taskcontrol.md).
TEST_F(ControlPlane, AnAutoscalingScaleDownWaitsForItsTaskController) {
  add_config("autoscale_interval = \"1s\"\n");
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0"), b("b", "r1");
  ASSERT_TRUE(a.connect(sock()));
  ASSERT_TRUE(b.connect(sock()));
  // Before the controller: its thread reads it until the controller is destroyed.
  std::atomic<bool> consent{false};
  FakeController ctl;
  ASSERT_NE(ctl.port(), 0);
  ctl.set_policy(consent_to(consent, "stop"));
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 2}}).ok());
  json job{{"name", "kv"},
           {"entitlement", "e"},
           {"count", 4},
           {"per_task", {{"cpu_milli", 1000}, {"mem_mb", 64}}},
           {"task_controller",
            {{"address", "127.0.0.1:" + std::to_string(ctl.port())}, {"timeout_ms", 5000}}},
           {"autoscale", {{"min", 1}, {"max", 8}, {"target", 0.5}, {"scale_down_window", "1s"}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  auto created = call("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  // Idle but for a tenth of a core a task: 0.4 cores over 4 tasks of a 0.5-core target
  // wants 1 task.
  a.set_cpu_milli(100);
  b.set_cpu_milli(100);
  auto pump_until = [&](auto pred, int ms_total) {
    for (int i = 0; i < ms_total / 50 && !pred(); ++i) {
      a.report();
      b.report();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
  };
  auto running = [&] { return a.running().size() + b.running().size(); };
  auto pending_stops = [&] {
    auto p = ctl.plans();
    size_t n = 0;
    if (!p.empty())
      for (const auto& op : p.back().value("pending", json::array())) n += op["kind"] == "stop";
    return n;
  };
  ASSERT_TRUE(pump_until([&] { return pending_stops() == 3; }, 15000))
      << (ctl.plans().empty() ? "no plan" : ctl.plans().back().dump());
  pump_until([] { return false; }, 2000);  // the controller still says no
  EXPECT_EQ(running(), 4u);
  EXPECT_EQ(a.stops() + b.stops(), 0);
  auto show = call("job.autoscale", {{"name", "kv"}});
  ASSERT_TRUE(show.ok());
  EXPECT_EQ((*show)["count"], 4) << show->dump();
  EXPECT_EQ((*show)["changes"].size(), 1u) << show->dump();  // once, not every round
  json op = ctl.plans().back()["pending"][0];
  EXPECT_EQ(op["reason"], "scale down from 4 to 1") << op.dump();
  // Consent: exactly the three stop, and the job is of 1.
  consent = true;
  ASSERT_TRUE(pump_until([&] { return running() == 1; }, 10000)) << running();
  pump_until([] { return false; }, 1500);
  EXPECT_EQ(running(), 1u);
  EXPECT_EQ(a.stops() + b.stops(), 3);
  auto shown = call("job.show", {{"name", "kv"}});
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ((*shown)["spec"]["count"], 1);
}

TEST_F(ControlPlane, ARollingUpdateWaitsForItsTaskController) {
  start();
  if (HasFatalFailure()) return;
  auto ms = fake_machines(3);
  for (auto& m : ms) ASSERT_TRUE(m->connect(sock()));
  FakeController ctl;
  ASSERT_NE(ctl.port(), 0);
  ctl.set_policy([](const json&) { return json::array(); });  // nothing may go
  ASSERT_TRUE(call("entitlement.create", {{"name", "a"}, {"quota", 3}}).ok());
  json job{{"name", "kv"},
           {"entitlement", "a"},
           {"count", 3},
           {"max_unavailable", 1},
           {"per_task", {{"cpu_milli", 1000}, {"mem_mb", 512}}},
           {"task_controller",
            {{"address", "127.0.0.1:" + std::to_string(ctl.port())}, {"timeout_ms", 1500}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  ASSERT_TRUE(call("job.create", job).ok());
  // The job's tasks by index: generation and state, as job.show has them.
  auto shown = [&] {
    std::map<int, std::pair<uint64_t, std::string>> out;  // live ones, newest generation
    auto r = call("job.show", {{"name", "kv"}});
    if (r.ok())
      for (const auto& t : (*r)["tasks"])
        if (t["state"] == "running" || t["state"] == "starting") {
          auto& e = out[t["index"].get<int>()];
          if (t["generation"].get<uint64_t>() >= e.first)
            e = {t["generation"].get<uint64_t>(), t["state"].get<std::string>()};
        }
    return out;
  };
  auto all_at = [&](uint64_t gen) {
    auto s = shown();
    if (s.size() != 3) return false;
    for (const auto& [i, e] : s)
      if (e.first != gen || e.second != "running") return false;
    return true;
  };
  auto pump_until = [&](auto pred, int ms_total) {
    for (int i = 0; i < ms_total / 50 && !pred(); ++i) {
      for (auto& m : ms) m->report();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
  };
  ASSERT_TRUE(pump_until([&] { return all_at(1); }, 5000));
  int stops = 0;
  for (auto& m : ms) stops += m->stops();
  ASSERT_EQ(stops, 0);
  // An update: the controller acks nothing, nothing is stopped; it is told of three
  // pending restarts and of the three tasks.
  job["task"]["argv"] = {"/bin/sleep", "1000"};
  ASSERT_TRUE(call("job.update", job).ok());
  auto last_plan = [&] {
    auto p = ctl.plans();
    return p.empty() ? json::object() : p.back();  // no plan yet: nothing pending
  };
  ASSERT_TRUE(
      pump_until([&] { return last_plan().value("pending", json::array()).size() == 3; }, 3000))
      << last_plan().dump();
  pump_until([] { return false; }, 1500);
  for (auto& m : ms) stops += m->stops();
  EXPECT_EQ(stops, 0);
  json plan = last_plan();
  auto tc = call("job.show", {{"name", "kv"}});
  ASSERT_TRUE(tc.ok());
  EXPECT_EQ((*tc)["task_controller"]["pending"].size(), 3u) << tc->dump();
  EXPECT_EQ((*tc)["task_controller"]["unreachable"], false);
  EXPECT_EQ(plan["job"], "kv");
  EXPECT_EQ(plan["generation"], 2);
  EXPECT_EQ(plan["tasks"].size(), 3u);
  EXPECT_EQ(plan["tasks"][0]["state"], "running");
  EXPECT_TRUE(plan["seq"].is_number_unsigned());
  // It acks index 0's restart only: that one restarts, and completes.
  std::string op0;
  for (const auto& op : plan["pending"])
    if (op["index"] == 0) op0 = op["op"];
  ASSERT_FALSE(op0.empty());
  ctl.set_policy([op0](const json&) { return json::array({op0}); });
  ASSERT_TRUE(pump_until(
      [&] {
        auto s = shown();
        return s.count(0) && s[0].first == 2 && s[0].second == "running";
      },
      5000));
  ASSERT_TRUE(pump_until(
      [&] {
        for (const auto& p : ctl.plans())
          for (const auto& c : p["completed"])
            if (c == op0) return true;
        return false;
      },
      3000));
  auto s = shown();
  EXPECT_EQ(s[1].first, 1u);  // the others wait
  EXPECT_EQ(s[2].first, 1u);
  // The audit log says who acted: the controller (often a task of some job), for the
  // operator who set the job and its controller up; and what it let happen.
  auto audit = call("audit.ls");
  ASSERT_TRUE(audit.ok()) << audit.error().str();
  json acted;
  for (const auto& e : (*audit)["entries"])
    if (e["method"] == "taskcontrol.ack") acted = e;
  ASSERT_FALSE(acted.is_null()) << audit->dump(2);
  EXPECT_EQ(acted["role"], "controller");
  EXPECT_EQ(acted["target"], "kv");
  std::string who = acted["who"];
  EXPECT_NE(who.find("TaskController at 127.0.0.1:" + std::to_string(ctl.port())),
            std::string::npos)
      << who;
  EXPECT_NE(who.find(" for uid " + std::to_string(getuid()) + " (pid "), std::string::npos) << who;
  EXPECT_EQ(acted["result"].get<std::string>().rfind("ok: stop kv.0.", 0), 0u) << acted.dump();
  // It acks everything: the update completes.
  ctl.set_policy([](const json& p) {
    json ack = json::array();
    for (const auto& op : p["pending"]) ack.push_back(op["op"]);
    return ack;
  });
  EXPECT_TRUE(pump_until([&] { return all_at(2); }, 8000)) << shown().size();
  // The controller goes away; another update proceeds once its 1.5 s timeout passed,
  // one task at a time (max_unavailable 1).
  ctl.stop();
  job["task"]["argv"] = {"/bin/sleep", "2000"};
  ASSERT_TRUE(call("job.update", job).ok());
  EXPECT_TRUE(pump_until([&] { return all_at(3); }, 15000));
  tc = call("job.show", {{"name", "kv"}});
  ASSERT_TRUE(tc.ok());
  EXPECT_EQ((*tc)["task_controller"]["unreachable"], true);
  EXPECT_EQ((*tc)["task_controller"]["fallback"], true);
  std::string log = read_file(dir_ + "/cp.log").value_or("");
  EXPECT_NE(log.find("task controller unreachable"), std::string::npos);
}

// The reference controller (examples/shard_controller) over a rolling update and a drain
// overlapping: 6 tasks hold 6 shards x 3 replicas (indices 0-2 and 3-5), floor 2. No
// shard ever has fewer than 2 replicas running, the controller lets two restarts go at
// once where that is safe (one in each group) although max_unavailable is 1, and the
// drained machine's task moves to the spare machine.
TEST_F(ControlPlane, TheShardControllerKeepsEveryShardAtItsFloor) {
  start();
  if (HasFatalFailure()) return;
  std::string ctl_sock = dir_ + "/ctl.sock";
  pid_t ctl = spawn_process({SHARD_CONTROLLER_BIN, "--listen", "unix:" + ctl_sock, "--shards", "6",
                             "--replicas", "3", "--floor", "2"},
                            {dir_ + "/ctl.log"});
  struct Reap {
    pid_t pid;
    ~Reap() { stop_process(pid); }
  } reap{ctl};
  auto ms = fake_machines(7);  // six for the tasks, one spare for the drain
  for (auto& m : ms) ASSERT_TRUE(m->connect(sock()));
  ASSERT_TRUE(call("entitlement.create", {{"name", "a"}, {"quota", 7}}).ok());
  json job{{"name", "kv"},
           {"entitlement", "a"},
           {"count", 6},
           {"max_unavailable", 1},
           {"per_task", {{"cpu_milli", 3000}, {"mem_mb", 512}}},  // one per machine
           {"task_controller", {{"address", "unix:" + ctl_sock}, {"timeout_ms", 5000}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  ASSERT_TRUE(call("job.create", job).ok());
  weft::example::ShardManager shards(6, 3, 2);
  auto running = [&](uint64_t* newest_gen_everywhere) {
    std::set<int> up;
    std::map<int, uint64_t> gen;
    auto r = call("job.show", {{"name", "kv"}});
    if (r.ok())
      for (const auto& t : (*r)["tasks"])
        if (t["state"] == "running") {
          up.insert(t["index"].get<int>());
          gen[t["index"].get<int>()] = t["generation"].get<uint64_t>();
        }
    if (newest_gen_everywhere) {
      uint64_t g = up.size() == 6 ? UINT64_MAX : 0;
      for (const auto& [i, v] : gen) g = std::min(g, v);
      *newest_gen_everywhere = g;
    }
    return up;
  };
  auto pump = [&] {
    for (auto& m : ms) m->report();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  uint64_t gen = 0;
  for (int i = 0; i < 250 && gen != 1; ++i) {
    pump();
    running(&gen);
  }
  ASSERT_EQ(gen, 1u);
  int busy = -1;  // a machine with a task, to drain
  for (int i = 0; i < 7 && busy < 0; ++i)
    if (!ms[static_cast<size_t>(i)]->running().empty()) busy = i;
  ASSERT_GE(busy, 0);
  job["task"]["argv"] = {"/bin/sleep", "1000"};
  ASSERT_TRUE(call("job.update", job).ok());
  ASSERT_TRUE(call("machine.drain", {{"machine", "h" + std::to_string(busy)}}).ok());
  size_t most_down = 0;
  int below = 0;
  auto drained = [&] { return ms[static_cast<size_t>(busy)]->running().empty(); };
  for (int i = 0; i < 600 && !(gen == 2 && drained()); ++i) {
    pump();
    auto up = running(&gen);
    most_down = std::max(most_down, 6 - up.size());
    below = std::max(below, shards.shards_below_floor(6, up, {}));
  }
  EXPECT_EQ(gen, 2u) << read_file(dir_ + "/ctl.log").value_or("")
                     << call("job.show", {{"name", "kv"}})->dump();
  EXPECT_TRUE(drained());
  EXPECT_EQ(below, 0);
  // The update's one and the drain's one, never more; whether the two were ever down in
  // the same sample depends on the machine's speed (a loaded one finished the first
  // before the second began), so only the bound is this test's to check.
  EXPECT_GE(most_down, 1u);
  EXPECT_LE(most_down, 2u);
}

// A TaskController that is a task of another job: the control plane finds it where
// that job's ready task runs (here, a machine on this host: loopback) and asks it there.
TEST_F(ControlPlane, AControllerThatIsATaskOfAnotherJobIsFoundWhereItRuns) {
  start();
  if (HasFatalFailure()) return;
  // The controller job's process (what its task runs), on loopback, on a port reserved
  // for this test; the test waits until it listens (if it cannot, it exits, and another
  // port is tried).
  struct Reap {
    pid_t pid = -1;
    ~Reap() {
      if (pid <= 0) return;
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  } reap;
  int port = 0;
  for (int attempt = 0; attempt < 5 && port == 0; ++attempt) {
    int candidate = free_tcp_port();
    ASSERT_NE(candidate, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(candidate));
    pid_t ctl =
        spawn_process({SHARD_CONTROLLER_BIN, "--listen", "127.0.0.1:" + std::to_string(candidate),
                       "--shards", "3", "--replicas", "2", "--floor", "1"},
                      {dir_ + "/ctl.log"});
    reap.pid = ctl;
    for (int i = 0; i < 1000; ++i) {
      if (waitpid(ctl, nullptr, WNOHANG) == ctl) {
        reap.pid = -1;
        break;
      }
      int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      bool up = connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      close(c);
      if (up) {
        port = candidate;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port == 0 && reap.pid > 0) {
      kill(reap.pid, SIGKILL);
      waitpid(reap.pid, nullptr, 0);
      reap.pid = -1;
    }
  }
  ASSERT_NE(port, 0) << read_file(dir_ + "/ctl.log").value_or("");
  auto ms = fake_machines(4);
  for (auto& m : ms) ASSERT_TRUE(m->connect(sock()));
  auto pump = [&] {
    for (auto& m : ms) m->report();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  ASSERT_TRUE(call("entitlement.create", {{"name", "a"}, {"quota", 4}}).ok());
  json job{{"name", "kv"},
           {"entitlement", "a"},
           {"count", 3},
           {"per_task", {{"cpu_milli", 3000}, {"mem_mb", 512}}},
           {"task_controller", {{"job", "ctl"}, {"port", port}, {"timeout_ms", 5000}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  ASSERT_TRUE(call("job.create", job).ok());
  // No controller job yet: nowhere to ask.
  auto shown = call("job.show", {{"name", "kv"}});
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ((*shown)["task_controller"]["address"], "") << shown->dump();
  EXPECT_EQ((*shown)["task_controller"]["job"], "ctl");
  ASSERT_TRUE(call("job.create", {{"name", "ctl"},
                                  {"entitlement", "a"},
                                  {"count", 1},
                                  {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
                                  {"task", {{"argv", {"/usr/bin/shard_controller"}}}}})
                  .ok());
  std::string address;
  for (int i = 0; i < 300 && address.empty(); ++i) {
    pump();
    auto r = call("job.show", {{"name", "kv"}});
    if (r.ok() && !(*r)["task_controller"]["unreachable"].get<bool>())
      address = (*r)["task_controller"]["address"].get<std::string>();
  }
  EXPECT_EQ(address, "127.0.0.1:" + std::to_string(port));
  // An update goes through the controller found there.
  job["task"]["argv"] = {"/bin/sleep", "1000"};
  ASSERT_TRUE(call("job.update", job).ok());
  bool updated = false;
  for (int i = 0; i < 500 && !updated; ++i) {
    pump();
    auto r = call("job.show", {{"name", "kv"}});
    int current = 0;
    if (r.ok())
      for (const auto& t : (*r)["tasks"])
        current += t["state"] == "running" && t["generation"] == 2;
    updated = current == 3;
  }
  EXPECT_TRUE(updated) << read_file(dir_ + "/ctl.log").value_or("");
  EXPECT_NE(read_file(dir_ + "/ctl.log").value_or("").find("acknowledged job=kv"),
            std::string::npos)
      << read_file(dir_ + "/ctl.log").value_or("");
}

// One task's operations through the control plane (docs/operations.md, "One task"):
// task.show (the record and the agent's detail), task.signal (a signal to the task on its
// machine; SIGKILL ends it and it is replaced), task.restart of a job without a
// TaskController (it stops and its index starts again on its machine); bad input names
// the field, an unknown task is not found.
TEST_F(ControlPlane, OneTasksOperationsReachItsMachine) {
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0");
  ASSERT_TRUE(a.connect(sock()));
  a.keep_alive();
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 1}}).ok());
  ASSERT_TRUE(call("job.create", {{"name", "web"},
                                  {"entitlement", "e"},
                                  {"count", 1},
                                  {"per_task", {{"cpu_milli", 500}, {"mem_mb", 64}}},
                                  {"task", {{"argv", {"/bin/sleep", "infinity"}}}}})
                  .ok());
  auto live_task = [&] {
    for (int i = 0; i < 200; ++i) {
      auto r = call("job.show", {{"name", "web"}});
      if (r.ok())
        for (const auto& t : (*r)["tasks"])
          if (t["state"] == "running" && a.running().count(t["id"].get<std::string>()))
            return t["id"].get<std::string>();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::string();
  };
  const std::string first = live_task();
  ASSERT_FALSE(first.empty());
  auto shown = call("task.show", {{"id", first}});
  ASSERT_TRUE(shown.ok()) << shown.error().str();
  EXPECT_EQ((*shown)["id"], first);
  EXPECT_EQ((*shown)["machine"], "a");
  EXPECT_EQ((*shown)["agent"]["state"], "running") << shown->dump();

  auto sent = call("task.signal", {{"id", first}, {"signal", "SIGHUP"}});
  ASSERT_TRUE(sent.ok()) << sent.error().str();
  auto events = a.events();
  EXPECT_NE(std::find(events.begin(), events.end(), "signal " + first + " SIGHUP"), events.end());
  EXPECT_EQ(a.running().count(first), 1u);

  // Restarted: it stops, and its index runs again on its machine as a new task.
  auto restarted = call("task.restart", {{"id", first}});
  ASSERT_TRUE(restarted.ok()) << restarted.error().str();
  EXPECT_EQ((*restarted)["waiting_for_controller"], false);
  std::string second;
  for (int i = 0; i < 100 && (second.empty() || second == first); ++i) second = live_task();
  EXPECT_NE(second, first);
  EXPECT_EQ(a.running().count(first), 0u);
  EXPECT_EQ(a.stops(), 1);

  // Killed: it ends on its machine and is replaced as a failed task is.
  ASSERT_TRUE(call("task.signal", {{"id", second}}).ok());  // SIGKILL
  std::string third;
  for (int i = 0; i < 100 && (third.empty() || third == second); ++i) third = live_task();
  EXPECT_NE(third, second);

  // Bad input and unknown tasks.
  for (const char* m : {"task.show", "task.signal", "task.restart"}) {
    auto r = call(m, json::object());
    ASSERT_FALSE(r.ok()) << m;
    EXPECT_EQ(r.error().message.rfind("id: ", 0), 0u) << r.error().str();
    EXPECT_EQ(call(m, {{"id", "web.9.999"}}).error().code, rpc::kNotFound) << m;
  }
  for (const json& sig :
       {json("hup; rm -rf /"), json(""), json(9), json("SIGTOOLONGFORANYSIGNAL")}) {
    auto r = call("task.signal", {{"id", third}, {"signal", sig}});
    ASSERT_FALSE(r.ok()) << sig.dump();
    EXPECT_EQ(r.error().message.rfind("signal: ", 0), 0u) << r.error().str();
  }
  // weftctl: task show --cluster, task signal.
  auto [rc, text] = weftctl("task show --cluster " + third);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("task " + third + ": running on a"), std::string::npos) << text;
  std::tie(rc, text) = weftctl("task signal " + third + " SIGUSR1");
  EXPECT_EQ(rc, 0) << text;
  events = a.events();
  EXPECT_NE(std::find(events.begin(), events.end(), "signal " + third + " SIGUSR1"), events.end());

  // The job's events say what happened, in order, paged.
  auto all = call("job.events", {{"name", "web"}, {"limit", 1000}});
  ASSERT_TRUE(all.ok()) << all.error().str();
  std::vector<std::string> seen;
  for (const auto& e : (*all)["events"])
    seen.push_back(e["task"].get<std::string>() + " " + e["what"].get<std::string>() +
                   (e.contains("detail") ? " (" + e["detail"].get<std::string>() + ")" : ""));
  auto index_of = [&](const std::string& line) {
    for (size_t i = 0; i < seen.size(); ++i)
      if (seen[i].rfind(line, 0) == 0) return static_cast<int>(i);
    return -1;
  };
  const int placed = index_of(first + " placed (a)"), ran = index_of(first + " running"),
            asked = index_of(first + " restart asked (restarted by "),
            stopping = index_of(first + " stopping"), again = index_of(second + " placed (a)");
  EXPECT_GE(placed, 0) << ::testing::PrintToString(seen);
  EXPECT_GT(ran, placed) << ::testing::PrintToString(seen);
  EXPECT_GT(asked, ran) << ::testing::PrintToString(seen);
  EXPECT_GT(stopping, asked) << ::testing::PrintToString(seen);
  EXPECT_GT(again, stopping) << ::testing::PrintToString(seen);
  EXPECT_GE(index_of(third + " placed"), 0) << ::testing::PrintToString(seen);
  // Paged: two at a time from the start give the same first events.
  auto page = call("job.events", {{"name", "web"}, {"limit", 2}});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ((*page)["events"].size(), 2u);
  auto next = call("job.events", {{"name", "web"}, {"limit", 2}, {"after", (*page)["next"]}});
  ASSERT_TRUE(next.ok());
  ASSERT_FALSE((*next)["events"].empty());
  EXPECT_EQ((*next)["events"][0]["seq"], (*all)["events"][2]["seq"]);
  EXPECT_EQ(call("job.events", {{"name", "nope"}}).error().code, rpc::kNotFound);
  EXPECT_EQ(call("job.events", {{"name", "web"}, {"limit", 0}}).error().message.rfind("limit", 0),
            0u);
  std::tie(rc, text) = weftctl("job events web");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("restart asked"), std::string::npos) << text;
}

// A restart of one task of a job with a TaskController waits for the controller: a
// pending `restart` operation naming who asked; nothing stops until it is acknowledged,
// then exactly that task stops and its index runs again.
TEST_F(ControlPlane, ARestartOfOneTaskWaitsForItsTaskController) {
  start();
  if (HasFatalFailure()) return;
  FakeMachine a("a", "r0"), b("b", "r1");
  for (FakeMachine* m : {&a, &b}) {
    ASSERT_TRUE(m->connect(sock()));
    m->keep_alive();
  }
  // Before the controller: its thread reads it until the controller is destroyed.
  std::atomic<bool> consent{false};
  FakeController ctl;
  ASSERT_NE(ctl.port(), 0);
  ctl.set_policy(consent_to(consent, "restart"));
  ASSERT_TRUE(call("entitlement.create", {{"name", "e"}, {"quota", 2}}).ok());
  ASSERT_TRUE(call("job.create", {{"name", "kv"},
                                  {"entitlement", "e"},
                                  {"count", 2},
                                  {"per_task", {{"cpu_milli", 1000}, {"mem_mb", 64}}},
                                  {"task_controller",
                                   {{"address", "127.0.0.1:" + std::to_string(ctl.port())},
                                    {"timeout_ms", 5000}}},
                                  {"task", {{"argv", {"/bin/sleep", "infinity"}}}}})
                  .ok());
  auto running = [&] { return a.running().size() + b.running().size(); };
  for (int i = 0; i < 200 && running() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(running(), 2u);
  std::string task = *(a.running().empty() ? b.running() : a.running()).begin();
  auto r = call("task.restart", {{"id", task}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ((*r)["waiting_for_controller"], true);
  auto pending = [&] {
    auto p = ctl.plans();
    json ops = json::array();
    if (!p.empty())
      for (const auto& op : p.back().value("pending", json::array()))
        if (op["kind"] == "restart") ops.push_back(op);
    return ops;
  };
  for (int i = 0; i < 200 && pending().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  json ops = pending();
  ASSERT_EQ(ops.size(), 1u) << (ctl.plans().empty() ? "no plan" : ctl.plans().back().dump());
  EXPECT_EQ(ops[0]["task"], task);
  EXPECT_EQ(ops[0]["reason"].get<std::string>().rfind("restarted by ", 0), 0u) << ops.dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the controller says no
  EXPECT_EQ(a.stops() + b.stops(), 0);
  consent = true;
  for (int i = 0; i < 200 && a.stops() + b.stops() < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(a.stops() + b.stops(), 1);
  for (int i = 0; i < 200 && running() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(running(), 2u);
  EXPECT_EQ(a.running().count(task) + b.running().count(task), 0u);
  EXPECT_EQ(a.starts() + b.starts(), 3);  // the two, and the restarted index again
}

}  // namespace
}  // namespace weft::testing
