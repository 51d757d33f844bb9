// For tests and benchmarks of control plane replicas (controlplane/store/replica_test.cc,
// bench/cp_failover.cc): weft-controlplane processes on one etcd, and machines as the
// control plane sees them (sessions that register, report and run what they are told,
// driven by the test or by a thread of their own), which look for the leader among the
// replicas' sockets as a machine daemon's link does.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base64.h"
#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "testing/etcd_server.h"
#include "testing/process.h"

namespace weft::testing {

using json = nlohmann::json;

// A machine's session as the control plane sees it (like process_test.cc's, with the
// replica search a machine daemon's link makes: every socket in turn, a follower's
// "not the leader" moves on). Driven by the test (connect, report), or by its own
// thread (start_reporting) as a machine daemon is: reports every interval, leaves a
// control plane that does not answer within `timeout_ms` (a frozen one) for the next.
class Machine {
 public:
  // `domain`: its fault domain ("" = one of its own, "r-<id>").
  explicit Machine(std::string id, std::string dc = "dc1", std::string domain = "")
      : id_(std::move(id)), dc_(std::move(dc)), domain_(domain.empty() ? "r-" + id_ : domain) {
    methods_.add("task.run", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::string name = p["name"].get<std::string>();
      std::lock_guard<std::recursive_mutex> g(world_mu_);
      if (running_.count(name)) return make_error("exists").with_code(rpc::kConflict);
      if (hold_starts_) {  // accepted, not running yet (hold_starts)
        if (held_starts_.insert(name).second) ++starts_;
        return json{{"id", name}};
      }
      // A region's shard names itself and the machine's epoch (agent/cp_session.h).
      if (p.contains("epoch"))
        fences_.insert(p.value("holder", "?") + "@" + std::to_string(p.value("epoch", 0ull)));
      running_.insert(name);
      ++starts_;
      started_.insert(name);
      return json{{"id", name}};
    });
    // A command inside a task (task.exec): it prints "exec in <task> on <machine>" and
    // exits 0, sent with the next report.
    methods_.add("task.exec", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::lock_guard<std::recursive_mutex> g(world_mu_);
      if (!p.contains("id") || !running_.count(p["id"].get<std::string>()))
        return make_error("no such task").with_code(rpc::kNotFound);
      execs_.emplace_back(++exec_seq_, p["id"].get<std::string>());
      return json{{"exec", exec_seq_}};
    });
    methods_.add("task.exec.input", [](const json&, const rpc::CallContext&) -> Result<json> {
      return json::object();
    });
    methods_.add("task.stop", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::lock_guard<std::recursive_mutex> g(world_mu_);
      running_.erase(p["id"].get<std::string>());
      held_starts_.erase(p["id"].get<std::string>());
      return json::object();
    });
  }
  ~Machine() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Registers with whichever of `socks` leads (from the one after the last that failed);
  // false when none does. In a region, a control plane that does not hold the machine
  // names the one that does (kMoved), as it tells a machine daemon's link: the machine
  // goes there, and back to `socks` when that one sends it back or does not answer.
  bool connect(const std::vector<std::string>& configured) {
    for (int hop = 0; hop < 3; ++hop) {
      std::string moved;
      if (connect_one(held_.empty() ? configured : held_, &moved)) return true;
      std::lock_guard<std::recursive_mutex> g(world_mu_);
      if (moved == "-" || moved.empty()) {  // nothing answered there, or sent back
        bool was_held = !held_.empty();
        held_.clear();
        if (!was_held && moved == "-") return false;
        continue;
      }
      held_ = rpc::split_endpoints(moved);
    }
    return false;
  }
  std::vector<std::string> held() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return held_;
  }

 private:
  // `moved`: "-" when nothing registered it, else where it was sent ("" = back).
  bool connect_one(const std::vector<std::string>& socks, std::string* moved) {
    *moved = "-";
    for (size_t i = 0; i < socks.size(); ++i) {
      const std::string& s = socks[(next_ + i) % socks.size()];
      auto c = rpc::Client::connect(s);
      if (!c.ok()) continue;
      (*c)->set_dispatcher(&methods_);
      auto r = (*c)->call("machine.register",
                          {{"machine", id_},
                           {"dc", dc_},
                           {"domain", domain_},
                           {"type", "std"},
                           {"cpu_milli", 4000},
                           {"mem_mb", 8192},
                           {"boot_id", boot_}},
                          timeout_ms_);
      if (!r.ok()) {
        std::lock_guard<std::recursive_mutex> g(world_mu_);
        last_error_ = r.error();
        if (r.error().code == rpc::kMoved) {
          *moved = r.error().leader;
          note("sent by " + s + " to " + (moved->empty() ? "the brokers" : *moved));
          return false;
        }
        continue;
      }
      if (!(*c)->call("health.report", {{"machine", id_}, {"verdict", "ok"}}, timeout_ms_).ok())
        continue;
      {
        std::lock_guard<std::recursive_mutex> g(world_mu_);
        registered_holder_.clear();
        if (r->is_object() && r->contains("holder") && (*r)["holder"].is_object())
          registered_holder_ = (*r)["holder"].value("shard", "?") + "@" +
                               std::to_string((*r)["holder"].value("epoch", 0ull));
      }
      note("registered at " + s + " (holder " + registered_holder() + ")");
      client_ = std::move(c).value();
      next_ = (next_ + i) % socks.size();
      connected_ = true;
      return true;
    }
    return false;
  }

 public:
  // One report; a lost session is dropped (reconnect with connect()).
  bool report() {
    if (!client_) return false;
    json tasks = json::object();
    for (const auto& t : running()) tasks[t] = "running";
    auto r = client_->call("machine.report", {{"machine", id_}, {"tasks", tasks}}, timeout_ms_);
    std::deque<std::pair<uint64_t, std::string>> execs;
    {
      std::lock_guard<std::recursive_mutex> g(world_mu_);
      execs.swap(execs_);
    }
    for (const auto& [n, task] : execs) {
      (void)client_->notify("task.exec.output",
                            {{"exec", n},
                             {"stream", "stdout"},
                             {"data", base64_encode("exec in " + task + " on " + id_ + "\n")}});
      (void)client_->notify("task.exec.exit", {{"exec", n}, {"status", 0}});
    }
    if (!r.ok()) {
      client_.reset();
      connected_ = false;
      ++next_;  // this one failed: the next connect starts after it
    }
    return r.ok();
  }
  // From now on its own thread connects, reports every `interval_ms` and reconnects;
  // connect()/report() are no longer the test's to call.
  void start_reporting(std::vector<std::string> socks, int interval_ms = 100,
                       int timeout_ms = 800) {
    timeout_ms_ = timeout_ms;
    thread_ = std::thread([this, socks = std::move(socks), interval_ms] {
      while (!stop_) {
        if (drop_.exchange(false)) {
          client_.reset();
          connected_ = false;
        }
        if (!client_)
          connect(socks);
        else
          report();
        std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
      }
    });
  }
  bool reporting() const { return thread_.joinable(); }
  // Holds every machine still while the caller looks at all of them.
  static std::unique_lock<std::recursive_mutex> snapshot() {
    return std::unique_lock<std::recursive_mutex>(world_mu_);
  }
  bool connected() const { return connected_; }
  const std::string& id() const { return id_; }
  // Silent: its tasks run on, unreported (a daemon restarting).
  void disconnect() {
    if (reporting()) {
      drop_ = true;
      return;
    }
    client_.reset();
    connected_ = false;
  }
  std::set<std::string> running() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return running_;
  }
  int starts() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return starts_;
  }
  // Every task it was asked to run (and ran), by name.
  std::set<std::string> started() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return started_;
  }
  // A region's: the holder and epoch ("s1@3") its last registration's reply named (""
  // none), and those every task.run carried.
  std::string registered_holder() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return registered_holder_;
  }
  // While on, a task.run is accepted but its task does not run (nor is it reported)
  // until release_starts(): an update or a drain waits for it, as for a slow start.
  void hold_starts(bool on) {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    hold_starts_ = on;
  }
  void release_starts() {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    hold_starts_ = false;
    running_.merge(held_starts_);
    held_starts_.clear();
  }
  // Where its daemon went and when (a test prints it when it fails): each registration
  // and each "moved", the last 200.
  std::string history() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    std::string out;
    for (const auto& line : history_) out += "  " + id_ + " " + line + "\n";
    return out;
  }
  std::set<std::string> fences() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return fences_;
  }
  Error last_error() const {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    return last_error_;
  }

 private:
  std::string id_, dc_, domain_, boot_ = random_hex(8);
  std::vector<std::string> held_;  // a region's holder named by kMoved
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Client> client_;
  size_t next_ = 0;
  int timeout_ms_ = 3000;
  std::atomic<bool> connected_{false}, drop_{false}, stop_{false};
  std::thread thread_;
  // What the sessions' threads change and the test reads: one lock for every machine,
  // so a test sees all of them at one moment (a task moved from one to another is
  // never seen on both, or on neither, by a check between the two commands).
  inline static std::recursive_mutex world_mu_;
  std::set<std::string> running_;
  std::set<std::string> held_starts_;
  std::deque<std::string> history_;
  void note(const std::string& what) {
    std::lock_guard<std::recursive_mutex> g(world_mu_);
    char stamp[32];
    auto now = std::chrono::system_clock::now().time_since_epoch();
    long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
    std::snprintf(stamp, sizeof stamp, "%02lld:%02lld:%02lld.%03lld", (ms / 3600000) % 24,
                  (ms / 60000) % 60, (ms / 1000) % 60, ms % 1000);
    history_.push_back(std::string(stamp) + " " + what);
    if (history_.size() > 200) history_.pop_front();
  }
  bool hold_starts_ = false;
  int starts_ = 0;
  std::set<std::string> started_;
  std::string registered_holder_;
  std::set<std::string> fences_;
  Error last_error_;
  std::deque<std::pair<uint64_t, std::string>> execs_;  // started, to answer
  uint64_t exec_seq_ = 0;
};

class Replica {
 public:
  // `top`: more top-level cp.toml lines (e.g. "failover_grace = \"0s\"\n").
  // `prefix`: its state's etcd prefix; `tables`: more tables after [store] (a region's
  // "[region]\nrole = ...").
  Replica(const std::string& bin, const std::string& dir, const std::string& name,
          const etcd::Config& etcd, const std::string& lease_ttl = "2s",
          const std::string& top = "", const std::string& prefix = "/replicas/",
          const std::string& tables = "")
      : bin_(bin) {
    dir_ = dir + "/" + name;
    (void)mkdir_p(dir_);
    port_ = weft::testing::free_tcp_port();
    std::string eps;
    for (const auto& e : etcd.endpoints) eps += (eps.empty() ? "\"" : ", \"") + e + "\"";
    // Every replica the same key for secrets at rest (docs/replicas.md), in its own file.
    (void)write_file_atomic(dir_ + "/secrets.key", "k1 " + std::string(64, 'e') + "\n", 0600);
    std::string conf =
        "secrets_key = \"" + dir_ + "/secrets.key\"\n" + "socket = \"" + dir_ +
        "/cp.sock\"\nstate_dir = \"" + dir_ +
        "/state\"\nlisten = \"127.0.0.1:" + std::to_string(port_) +
        "\"\nheartbeat_interval = \"200ms\"\nmissed_heartbeats = 5\n"
        "log_level = \"debug\"\nmetrics_listen = \"\"\n" +
        // The ReBalancer moves nothing a test did not ask for (a test that
        // does sets rebalancer.* in `top`).
        (top.find("rebalancer.") == std::string::npos ? "rebalancer.enabled = false\n" : "") + top +
        "[store]\nkind = \"etcd\"\netcd_endpoints = [" + eps + "]\netcd_prefix = \"" + prefix +
        "\"\nlease_ttl = \"" + lease_ttl + "\"\n";
    if (!etcd.ca.empty())
      conf += "etcd_ca = \"" + etcd.ca + "\"\netcd_cert = \"" + etcd.cert + "\"\netcd_key = \"" +
              etcd.key + "\"\n";
    conf += tables;
    (void)write_file(dir_ + "/cp.toml", conf);
  }
  ~Replica() { stop(SIGKILL); }
  // Runs in this network namespace (/run/netns/NAME; root), e.g. one a test cuts off.
  void set_netns(std::string name) { netns_ = std::move(name); }
  void start() {
    status_ = -1;
    pid_ = spawn_process({bin_, "-c", dir_ + "/cp.toml"}, {dir_ + "/cp.log", false, netns_});
  }
  // The exit status once it ended by itself (-1 while it runs).
  pid_t pid() const { return pid_; }
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
    int st = stop_process(pid_, 0);  // signalled above: reaped here
    // Ended: exited() says so, and the tests that play systemd start it again.
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
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
  std::string bin_, dir_, netns_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
  int status_ = -1;
};

}  // namespace weft::testing
