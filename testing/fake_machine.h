// For tests of weft-controlplane as a process (controlplane/process_*_test.cc): a fake
// machine on its socket.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/services.h"
#include "common/strings.h"
#include "common/task_spec.h"
#include "common/task_usage.h"
#include "testing/machine_wire.h"

namespace weft::testing {

using json = nlohmann::json;

// A machine as the control plane sees it: a session that registers, reports its tasks,
// and runs/stops what it is told. It speaks when the test makes it (report(), call()),
// so a test can make it fall silent; keep_alive() heartbeats from a thread of its own,
// as a real agent does, while the test is busy for longer than the dead-machine timeout
// (a subprocess or a wait on a loaded machine). Every use of the session is under one
// lock, and the accessors return copies: a command may arrive during a heartbeat.
class FakeMachine {
 public:
  // reports_ready: registers as an agent that reports "ready" (readiness checks); an
  // older agent's "running" counts as ready.
  FakeMachine(std::string machine_id, std::string rack, bool reports_ready = false)
      : id_(std::move(machine_id)), rack_(std::move(rack)), reports_ready_(reports_ready) {
    methods_.add("task.run", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      // The agent's own validator on what the control plane sends.
      auto spec = parse_task_spec(p);
      if (!spec.ok()) {
        refusals_.push_back(p.dump() + " -> " + spec.error().str());
        return spec.error();
      }
      running_.insert(p["name"].get<std::string>());
      runs_.push_back(p);
      events_.push_back("run");
      ++starts_;
      return json{{"id", p["name"]}};
    });
    methods_.add("image.pull", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      events_.push_back("pull " + p.value("image", "") + (p.value("wait", false) ? " wait" : ""));
      return json{{"image", p.value("image", "")}};
    });
    methods_.add("task.stop", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      events_.push_back("stop");
      ordered_.push_back({next_seq(), "stop " + p["id"].get<std::string>()});
      running_.erase(p["id"].get<std::string>());
      ++stops_;
      return json::object();
    });
    // One task's detail and a signal to it (task.show, task.signal through the control
    // plane): a SIGKILL ends the task, as the agent's would.
    methods_.add("task.show", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::string id = p.value("id", "");
      if (!running_.count(id)) return make_error("no task " + id).with_code(rpc::kNotFound);
      return json{{"id", id},
                  {"name", id},
                  {"state", "running"},
                  {"spec", {{"argv", {"/bin/sleep", "infinity"}}, {"env", {{"TOKEN", "s3cret"}}}}}};
    });
    methods_.add("task.kill", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::string id = p.value("id", ""), sig = p.value("signal", "SIGKILL");
      if (!running_.count(id)) return make_error("no task " + id).with_code(rpc::kNotFound);
      events_.push_back("signal " + id + " " + sig);
      if (sig == "SIGKILL") running_.erase(id);
      return json{{"id", id}};
    });
    // What the control plane says of a quiet heartbeat (docs/protocol.md).
    methods_.add("report.resend", [this](const json&, const rpc::CallContext&) -> Result<json> {
      events_.push_back("resend");
      return json::object();
    });
    methods_.add("report.forget", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      events_.push_back("forget " + p.value("forget", json::array()).dump());
      return json::object();
    });
    // Usage, as an agent samples it: every running task asked for at cpu_milli_.
    methods_.add("task.usage", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      TRY_ASSIGN(UsageRequest req, parse_usage_request(p));
      UsageReport r{1000, {}, {}};
      for (const auto& id : req.tasks)
        if (running_.count(id)) r.tasks[id] = TaskUsage{cpu_milli_, 64 << 20, 0, 0, std::nullopt};
      // An app metric: as much per task as the CPU figure, in thousandths.
      for (const auto& g : req.scrape)
        for (const auto& id : g.tasks)
          if (auto it = r.tasks.find(id); it != r.tasks.end())
            it->second.metric = static_cast<double>(cpu_milli_) / 1000.0;
      ++usage_asks_;
      return to_json(r);
    });
    // Service discovery (an agent with dns_listen): the agent's own reader of updates.
    // task.exec (weftctl task exec): started at once; the command's output ("ran:" and
    // its command line) goes with the next report, and its exit (status 3) with the one
    // after the end of its input. Input is kept.
    methods_.add("task.exec", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      std::string id = p.value("id", "");
      if (!running_.count(id)) return make_error("no task " + id).with_code(rpc::kNotFound);
      const uint64_t n = ++execs_;
      std::string line = "ran:";
      for (const auto& a : p["command"]) line += " " + a.get<std::string>();
      events_.push_back("exec " + id + (p.value("tty", false) ? " tty" : ""));
      exec_out_.push_back(
          {"task.exec.output",
           {{"exec", n}, {"stream", "stdout"}, {"data", base64_encode(line + "\n")}}});
      return json{{"exec", n}};
    });
    methods_.add("task.exec.input", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      if (p.contains("data"))
        if (auto d = base64_decode(p["data"].get<std::string>()); d.ok()) exec_in_ += *d;
      if (p.value("eof", false))
        exec_out_.push_back({"task.exec.exit", {{"exec", p["exec"]}, {"status", 3}}});
      return json::object();
    });
    methods_.add("service.update", [this](const json& p, const rpc::CallContext&) -> Result<json> {
      TRY_ASSIGN(ServiceUpdate u, parse_service_update(p));
      if (mute_updates_) return make_error("muted");  // no acknowledgement
      catalog_.apply(u);
      ordered_.push_back({next_seq(), "update " + std::to_string(u.version)});
      return json{{"version", catalog_.version()}};
    });
  }
  // Answers task.usage (common/task_usage.h) with `cpu_milli` for every task it runs.
  void set_cpu_milli(uint64_t cpu_milli) {
    std::lock_guard lock(mu_);
    cpu_milli_ = cpu_milli;
  }
  // Registers as an agent that answers DNS (service.update), before connect().
  void serve_discovery() { serves_discovery_ = true; }
  // ... told only of these jobs and those it asks for later (service.interest), as
  // weft-agent is unless dns_services = "all".
  void serve_discovery_of(std::vector<std::string> jobs) {
    serves_discovery_ = true;
    interest_ = std::move(jobs);
  }
  void mute_updates(bool on) {
    std::lock_guard lock(mu_);
    mute_updates_ = on;
  }
  // Its copy of the endpoints, and what it was sent in one order across every fake
  // machine: "update <version>", "stop <task>".
  ServiceCatalog catalog() const {
    std::lock_guard lock(mu_);
    return catalog_;
  }
  std::vector<std::pair<int, std::string>> ordered() const {
    std::lock_guard lock(mu_);
    return ordered_;
  }
  ~FakeMachine() { stop_keep_alive(); }
  // Registers; its first verdict is `verdict` (weft-hcs's, sent at once).
  bool connect(const std::string& sock, const rpc::ClientTls* tls = nullptr,
               const std::string& verdict = "ok") {
    std::lock_guard lock(mu_);
    auto c = rpc::Client::connect(sock, rpc::kDefaultMaxLine, tls);
    if (!c.ok()) {
      error_ = c.error();
      return false;
    }
    client_ = std::move(c).value();
    client_->set_dispatcher(&methods_);
    Registration reg;
    reg.machine = id_;
    reg.domain = rack_;
    reg.type = "std";
    reg.cpu_milli = 4000;
    reg.mem_mb = 8192;
    reg.reports_ready = reports_ready_;
    reg.serves_discovery = serves_discovery_;
    reg.boot_id = boot_id_;
    reg.dns_interest = interest_;
    auto r = client_->call("machine.register", registration(reg));
    if (r.ok()) r = client_->call("health.report", health_verdict(id_, verdict));
    if (!r.ok()) error_ = r.error();
    return r.ok();
  }
  Error error() const {
    std::lock_guard lock(mu_);
    return error_;
  }
  // A reboot: a new boot id, nothing running, the next connect() registers again.
  void reboot() {
    std::lock_guard lock(mu_);
    client_.reset();
    running_.clear();
    boot_id_ = random_hex(8);
  }
  void report() {
    std::lock_guard lock(mu_);
    if (!client_) return;  // down (rebooting)
    std::map<std::string, std::string> tasks;
    for (const auto& t : running_) tasks[t] = "running";
    for (const auto& [t, state] : ended_) tasks[t] = state;
    if (client_->call("machine.report", task_list_report(id_, tasks)).ok()) ended_.clear();
    for (auto& [method, params] : exec_out_) (void)client_->notify(method, params);
    exec_out_.clear();
  }
  std::string exec_input() const {
    std::lock_guard lock(mu_);
    return exec_in_;
  }
  // The task ends by itself ("exited": its program exited 0; "failed"): said in the
  // next report.
  void end_task(const std::string& id, const std::string& state) {
    std::lock_guard lock(mu_);
    if (running_.erase(id)) ended_[id] = state;
  }
  // A machine.report of this machine with these fields (a digest, changes, ...).
  Result<json> report_with(const json& fields) {
    std::lock_guard lock(mu_);
    json p{{"machine", id_}};
    p.update(fields);
    return client_->call("machine.report", p);
  }
  // The same as a quiet heartbeat (a notification), then a controlplane.status request
  // (no heartbeat of its own), whose answer comes after whatever the control plane said
  // of the notification.
  Result<json> quiet_report_with(const json& fields) {
    std::lock_guard lock(mu_);
    json p{{"machine", id_}};
    p.update(fields);
    TRY(client_->notify("machine.report", p));
    return client_->call("controlplane.status", json::object());
  }
  void disconnect() {
    std::lock_guard lock(mu_);
    client_.reset();
  }
  Result<json> call(const std::string& method, const json& params) {
    std::lock_guard lock(mu_);
    return client_->call(method, params);
  }
  // Reports every 100 ms from a thread until stop_keep_alive() (or the destructor).
  void keep_alive() {
    if (alive_.joinable()) return;
    stop_alive_ = false;
    alive_ = std::thread([this] {
      while (!stop_alive_) {
        report();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  void stop_keep_alive() {
    if (!alive_.joinable()) return;
    stop_alive_ = true;
    alive_.join();
  }
  std::set<std::string> running() const {
    std::lock_guard lock(mu_);
    return running_;
  }
  int starts() const {
    std::lock_guard lock(mu_);
    return starts_;
  }
  int stops() const {
    std::lock_guard lock(mu_);
    return stops_;
  }
  std::vector<std::string> refusals() const {
    std::lock_guard lock(mu_);
    return refusals_;
  }
  std::vector<json> runs() const {  // every task.run's params
    std::lock_guard lock(mu_);
    return runs_;
  }
  // "run", "stop", "pull <image>[ wait]" in the order the control plane sent them.
  std::vector<std::string> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  std::string id_, rack_;
  bool reports_ready_ = false;
  std::string boot_id_ = random_hex(8);
  mutable std::mutex mu_;
  std::map<std::string, std::string>
      ended_;  // end_task's, until reported  // the session and everything its commands change
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Client> client_;
  std::set<std::string> running_;
  std::vector<std::string> refusals_;
  std::vector<json> runs_;
  uint64_t execs_ = 0;
  std::vector<std::pair<std::string, json>> exec_out_;  // notifications for the next report
  std::string exec_in_;
  std::vector<std::string> events_;
  int starts_ = 0, stops_ = 0;
  bool serves_discovery_ = false, mute_updates_ = false;
  uint64_t cpu_milli_ = 0;
  int usage_asks_ = 0;
  ServiceCatalog catalog_;
  std::optional<std::vector<std::string>> interest_;
  std::vector<std::pair<int, std::string>> ordered_;
  static int next_seq() {
    static std::atomic<int> seq{0};
    return ++seq;
  }
  Error error_;
  std::thread alive_;
  std::atomic<bool> stop_alive_{false};
};

// `n` machines "h0", "h1", ..., each on a rack of its own ("r0", "r1", ...), not yet
// connected.
inline std::vector<std::unique_ptr<FakeMachine>> fake_machines(int n) {
  std::vector<std::unique_ptr<FakeMachine>> ms;
  for (int i = 0; i < n; ++i)
    ms.push_back(std::make_unique<FakeMachine>("h" + std::to_string(i), "r" + std::to_string(i)));
  return ms;
}

}  // namespace weft::testing
