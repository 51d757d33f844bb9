// The fleet simulator (issue 14): thousands of simulated machines, each with the three
// sessions of its daemons (agent, sidekick, hcs), over real TCP (or mutual TLS) to a real
// weft-controlplane started by the simulator, all on one event loop. The machines
// register with the shapes and fault domains of Alibaba's 2018 machine list
// (../shared/data), report as the daemons do, answer task.run / task.stop /
// profile.apply (with a configurable delay and failure rate), and die on command.
//
// Phases, each printed with the control plane's CPU and RSS, the messages the fleet sent
// per second and the report round trip (p50/p99):
//   register  every machine connects and registers (at most --connect-window at once)
//   rest      steady state for --rest seconds
//   create    --jobs jobs of --tasks tasks through the Unix socket (--clients at once):
//             job.create rate and latency, then the time until every task runs
//   rest      steady state with the tasks
//   fail      --fail-percent of the machines with tasks die at once (sessions closed,
//             never back): time from death until each lost task runs elsewhere
//
//   build/bench/fleet_sim --machines 5000 --jobs 200 --tasks 36
//   build/bench/fleet_sim --machines 5000 --jobs 1000 --tasks 1000 --phases register,create
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/fleet.h"
#include "bench/sim_util.h"
#include "common/clock.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rpc/client.h"
#include "common/services.h"
#include "common/strings.h"
#include "common/task_report.h"
#include "common/tls.h"
#include "testing/ports.h"

using namespace weft;
using namespace weft::bench;
using namespace weft::bench::fleet;
using json = nlohmann::json;

namespace {

// Twine's Fig. 14: what a rolling update of a sharded job looks like second by second,
// read from job.show on another thread (the fleet's loop keeps serving).
struct Fig14Sampler {
  struct Row {
    double t = 0;  // seconds since the update began, on the paper's timeline (/ scale)
    int updating = 0, blocked = 0, waiting = 0, failed_down = 0, one_down = 0, two_down = 0;
    int two_down_by_update = 0;  // shards with 2+ replicas down, not counting the failure's
  };
  std::vector<Row> rows;
  std::mutex mu;
  std::set<std::string> failed_machines;  // the MSB's, from its failure to its return
  std::set<int> failed_indices;           // indices that were on them when they failed
  std::atomic<bool> stop{false}, settled{false};
  std::thread thread;

  void start(const std::string& socket, const Options& o, uint64_t t0) {
    thread = std::thread([this, socket, &o, t0] {
      auto c = rpc::Client::connect(socket);
      if (!c.ok()) return;
      uint64_t next = now_monotonic_us();
      while (!stop) {
        next += static_cast<uint64_t>(1e6 * o.scale);
        auto r = (*c)->call("job.show", {{"name", "shards"}}, 30'000);
        if (r.ok()) sample(*r, o, t0);
        uint64_t now = now_monotonic_us();
        if (next > now) std::this_thread::sleep_for(std::chrono::microseconds(next - now));
      }
    });
  }
  void join() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  void sample(const json& show, const Options& o, uint64_t t0) {
    uint64_t gen = show.value("generation", uint64_t{0});
    int count = show["spec"].value("count", 0);
    std::vector<int> up(static_cast<size_t>(count), 0), updating(static_cast<size_t>(count), 0),
        old_live(static_cast<size_t>(count), 0);
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& t : show["tasks"]) {
      int i = t.value("index", -1);
      if (i < 0 || i >= count) continue;
      std::string st = t.value("state", "");
      bool ready = st == "running" && t.value("ready", false);
      bool current = t.value("generation", uint64_t{0}) == gen;
      if (ready) up[static_cast<size_t>(i)] = 1;
      if (!current && (st == "running" || st == "draining")) old_live[static_cast<size_t>(i)] = 1;
      if ((!current && st == "stopping") ||
          (current && (st == "pending" || st == "starting" || (st == "running" && !ready))))
        updating[static_cast<size_t>(i)] = 1;
    }
    Row row;
    row.t = static_cast<double>(now_monotonic_us() - t0) / 1e6 / o.scale;
    for (int i = 0; i < count; ++i) {
      bool down = !up[static_cast<size_t>(i)];
      bool failure = failed_indices.count(i) > 0 && down;
      row.failed_down += failure;
      row.updating += updating[static_cast<size_t>(i)] && !failure;
      row.waiting += old_live[static_cast<size_t>(i)] && up[static_cast<size_t>(i)] &&
                     !updating[static_cast<size_t>(i)];
    }
    if (show.contains("task_controller"))
      row.blocked =
          static_cast<int>(show["task_controller"].value("pending", json::array()).size());
    for (int sh = 0; sh < o.shards; ++sh) {
      int down = 0, by_update = 0;
      for (int r = 0; r < o.replicas; ++r) {
        int i = (sh * o.replicas + r) % count;
        if (up[static_cast<size_t>(i)]) continue;
        ++down;
        by_update += !failed_indices.count(i);
      }
      row.one_down += down == 1;
      row.two_down += down >= 2;
      row.two_down_by_update += by_update >= 2;
    }
    bool done = true;
    for (int i = 0; i < count; ++i) done = done && up[static_cast<size_t>(i)];
    for (const auto& t : show["tasks"])
      if (t.value("generation", uint64_t{0}) != gen &&
          (t.value("state", "") == "running" || t.value("state", "") == "stopping"))
        done = false;
    settled = done && show["tasks"].size() >= static_cast<size_t>(count);
    rows.push_back(row);
  }
};

// Twine's Fig. 14 (docs/benchmarks.md): one job of --tasks tasks holding --shards shards x
// --replicas replicas; a rolling update at T0; at T120 the fault domain running the most
// tasks fails, and comes back at T415 (both times --scale). With --controller the job
// names a shard_controller (floor --floor); without, max_unavailable paces the update.
template <class Pump>
int fig14(EventLoop& loop, Fleet& fleet, const Options& o, const std::string& dir, Pump pump) {
  auto admin = rpc::Client::connect(dir + "/cp.sock");
  if (!admin.ok()) return 1;
  auto& a = **admin;
  (void)a.call("entitlement.create", {{"name", "fleet"}, {"quota", o.machines}});
  pid_t ctl = -1;
  std::string ctl_sock = dir + "/ctl.sock";
  if (!o.controller.empty()) {
    ctl = fork();
    if (ctl == 0) {
      int fd = ::open((dir + "/ctl.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::string shards = std::to_string(o.shards), replicas = std::to_string(o.replicas),
                  floor = std::to_string(o.floor), in_flight = std::to_string(o.max_in_flight);
      execl(o.controller.c_str(), "shard_controller", "--listen", ("unix:" + ctl_sock).c_str(),
            "--shards", shards.c_str(), "--replicas", replicas.c_str(), "--floor", floor.c_str(),
            "--max-in-flight", in_flight.c_str(), nullptr);
      _exit(127);
    }
    run_until(
        loop, [&] { return path_exists(ctl_sock); }, 10, pump);
  }
  json job{{"name", "shards"},
           {"entitlement", "fleet"},
           {"count", o.tasks},
           {"max_unavailable", o.max_unavailable},
           {"per_task", {{"cpu_milli", o.task_cpu_milli}, {"mem_mb", o.task_mem_mb}}},
           {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  if (ctl > 0) job["task_controller"] = {{"address", "unix:" + ctl_sock}, {"timeout_ms", 10000}};
  auto created = a.call("job.create", job, 120'000);
  int status = 0;
  if (!created.ok()) {
    std::fprintf(stderr, "fig14: job.create: %s\n", created.error().str().c_str());
    status = 1;
  }
  if (status == 0 && run_until(
                         loop, [&] { return fleet.running() >= static_cast<size_t>(o.tasks); },
                         o.timeout_s, pump) < 0) {
    std::fprintf(stderr, "fig14: the job's tasks did not all start\n");
    status = 1;
  }
  // Every task ready as the control plane sees it (its reports may lag the fleet's).
  if (status == 0 && run_until(
                         loop,
                         [&, last = uint64_t{0}]() mutable {
                           if (now_monotonic_us() - last < 500'000) return false;
                           last = now_monotonic_us();
                           auto show = a.call("job.show", {{"name", "shards"}});
                           int ready = 0;
                           if (show.ok())
                             for (const auto& t : (*show)["tasks"])
                               ready +=
                                   t.value("state", "") == "running" && t.value("ready", false);
                           return ready == o.tasks;
                         },
                         o.timeout_s, pump) < 0)
    status = 1;
  Fig14Sampler sampler;
  if (status == 0) {
    uint64_t t0 = now_monotonic_us();
    // json::array, not `= {...}`: clang before 17 leaks the old value when a braced list is
    // assigned inside a template (llvm/llvm-project#51037); the sanitizer tree is clang's.
    job["task"]["argv"] = json::array({"/bin/sleep", "1000000"});
    auto updated = a.call("job.update", job, 120'000);
    if (!updated.ok()) status = 1;
    sampler.start(dir + "/cp.sock", o, t0);
    auto at = [&](double paper_s) {
      double left = paper_s * o.scale - static_cast<double>(now_monotonic_us() - t0) / 1e6;
      if (left > 0)
        run_until(
            loop, [] { return false; }, left, pump);
    };
    at(120);
    std::string domain = fleet.busiest_domain();
    {
      // The indices that were on the domain's machines, from the control plane's view.
      auto show = a.call("job.show", {{"name", "shards"}});
      std::set<std::string> names;
      for (int i = 0; i < o.machines; ++i)
        if (o.domain_size > 0 && "msb" + std::to_string(i / o.domain_size) == domain)
          names.insert(machine_name(i));
      std::lock_guard<std::mutex> lock(sampler.mu);
      sampler.failed_machines = names;
      if (show.ok())
        for (const auto& t : (*show)["tasks"])
          if (names.count(t.value("machine", "")) && t.value("state", "") == "running")
            sampler.failed_indices.insert(t.value("index", -1));
    }
    auto killed = fleet.kill_domain(domain);
    std::printf("fig14: T120 fault domain %s failed: %zu machines, %zu task indices\n",
                domain.c_str(), killed.size(), sampler.failed_indices.size());
    at(415);
    fleet.revive_domain(domain);
    std::printf("fig14: T415 fault domain %s back\n", domain.c_str());
    std::fflush(stdout);
    double s = run_until(
        loop, [&] { return sampler.settled.load(); }, o.timeout_s, pump);
    if (s < 0) {
      std::fprintf(stderr, "fig14: the update did not finish within --timeout\n");
      status = 1;
    }
    at(sampler.rows.empty() ? 0 : sampler.rows.back().t + 5);  // a few samples at rest
  }
  sampler.join();
  if (ctl > 0) {
    kill(ctl, SIGTERM);
    waitpid(ctl, nullptr, 0);
  }
  (void)a.call("job.stop", {{"name", "shards"}});
  // The failure window: from the failure until every index it took down is up again.
  double fail_start = 120, fail_end = 415;
  for (const auto& r : sampler.rows)
    if (r.t >= 415 && r.failed_down == 0) {
      fail_end = r.t;
      break;
    }
  int most_two = 0, most_two_outside = 0, most_two_by_update = 0, most_one = 0;
  double shard_s_two_outside = 0, end_t = 0;
  for (const auto& r : sampler.rows) {
    most_two = std::max(most_two, r.two_down);
    most_one = std::max(most_one, r.one_down);
    most_two_by_update = std::max(most_two_by_update, r.two_down_by_update);
    bool outside = r.t < fail_start || r.t > fail_end;
    if (outside) {
      most_two_outside = std::max(most_two_outside, r.two_down);
      shard_s_two_outside += r.two_down;
    }
    if (r.updating > 0 || r.waiting > 0) end_t = r.t;
  }
  std::printf(
      "fig14 %s: update of %d tasks done at T%.0f; shards with one replica down at most %d; "
      "with two or more down at most %d (%d outside the failure window T%.0f-T%.0f, %.0f "
      "shard-seconds outside it; %d by the update alone)\n",
      o.controller.empty() ? "without TaskController" : "with TaskController", o.tasks, end_t,
      most_one, most_two, most_two_outside, fail_start, fail_end, shard_s_two_outside,
      most_two_by_update);
  if (o.expect_floor && (most_two_outside > 0 || sampler.rows.empty())) {
    std::fprintf(stderr, "fig14: %d shards had two or more replicas down outside the failure\n",
                 most_two_outside);
    status = 1;
  }
  if (!o.out.empty()) {
    std::ofstream csv(o.out);
    csv << "t,updating,blocked,waiting,failed_down,one_down,two_down,two_down_by_update\n";
    for (const auto& r : sampler.rows)
      csv << r.t << ',' << r.updating << ',' << r.blocked << ',' << r.waiting << ','
          << r.failed_down << ',' << r.one_down << ',' << r.two_down << ',' << r.two_down_by_update
          << '\n';
  }
  return status;
}

}  // namespace

// Issue 33: how fast a change of endpoints reaches every agent's DNS copy, and how long
// the stop of a withdrawn task waits for it. A job of --discovery-tasks is created; once
// every agent holds all its endpoints, it is scaled down one task at a time: each step is
// timed from the job.scale call until every agent holds the smaller set, and until the
// stop reaches the task's machine (which waits for every agent's acknowledgement).
int discovery(EventLoop& loop, Fleet& fleet, const Options& o, const std::string& dir,
              const std::function<void()>& pump) {
  auto admin = rpc::Client::connect(dir + "/cp.sock");
  if (!admin.ok()) return 1;
  (void)(*admin)->call("entitlement.create", {{"name", "fleet"}, {"quota", o.machines}});
  json job{{"name", "svc"},
           {"entitlement", "fleet"},
           {"count", o.discovery_tasks},
           {"per_task", {{"cpu_milli", 100}, {"mem_mb", 64}}},
           {"ports", {{"http", 0}}},
           {"task", {{"argv", {"/bin/true"}}}}};
  if (auto r = (*admin)->call("job.create", job); !r.ok()) {
    std::fprintf(stderr, "fleet_sim: discovery job: %s\n", r.error().str().c_str());
    return 1;
  }
  size_t agents = fleet.sessions_wanted() / static_cast<size_t>(o.daemons);
  auto n = static_cast<size_t>(o.discovery_tasks);
  if (run_until(
          loop, [&] { return fleet.agents_with(n) == agents; }, o.timeout_s, pump) < 0) {
    std::printf("discovery: not every agent got the job's %zu endpoints (%zu of %zu agents)\n", n,
                fleet.agents_with(n), agents);
    return 1;
  }
  std::vector<double> all_ms, last_ms, stop_ms;
  uint64_t updates0 = fleet.service_updates();
  int status = 0;
  for (int step = 0; step < o.discovery_steps && n > 1; ++step) {
    json shown = (*admin)->call("service.show", {{"job", "svc"}}).value_or(json());
    std::string leaving;
    for (const auto& e : shown.value("endpoints", json::array()))
      if (e["index"] == static_cast<int>(n - 1)) leaving = e["task"];
    uint64_t t0 = now_monotonic_us();
    std::atomic<bool> answered{false};
    std::thread caller([&] {
      auto c = rpc::Client::connect(dir + "/cp.sock");
      if (c.ok()) (void)(*c)->call("job.scale", {{"name", "svc"}, {"count", n - 1}});
      answered = true;
    });
    double s = run_until(
        loop,
        [&] {
          return answered && fleet.agents_with(n - 1) == agents &&
                 (leaving.empty() || fleet.stopped_at(leaving) != 0);
        },
        o.timeout_s, pump);
    caller.join();
    if (s < 0) {
      status = 1;
      break;
    }
    auto at = fleet.changed_at(n - 1);
    for (uint64_t t : at) all_ms.push_back(static_cast<double>(t - t0) / 1e3);
    last_ms.push_back(static_cast<double>(*std::max_element(at.begin(), at.end()) - t0) / 1e3);
    if (!leaving.empty()) {
      stop_ms.push_back(static_cast<double>(fleet.stopped_at(leaving) - t0) / 1e3);
      // Withdraw before stop: the stop comes after every agent took the withdrawal.
      if (fleet.stopped_at(leaving) < *std::max_element(at.begin(), at.end())) {
        std::printf(
            "discovery: the stop of %s reached its machine before every agent had "
            "it withdrawn\n",
            leaving.c_str());
        status = 1;
      }
    }
    --n;
  }
  std::printf(
      "discovery: %zu agents, %zu steps: a withdrawal reached an agent p50 %.1f ms p99 %.1f ms; "
      "every agent p50 %.1f ms max %.1f ms; its stop was sent p50 %.1f ms max %.1f ms after "
      "job.scale; %llu service updates taken%s\n",
      agents, last_ms.size(), pct(all_ms, 50), pct(all_ms, 99), pct(last_ms, 50), pct(last_ms, 100),
      pct(stop_ms, 50), pct(stop_ms, 100),
      static_cast<unsigned long long>(fleet.service_updates() - updates0),
      status ? " (TIMEOUT)" : "");
  return status;
}

int main(int argc, char** argv) {
  CLI::App app{"fleet_sim: simulated machines against a real weft-controlplane"};
  Options o;
  app.add_option("--machines", o.machines, "simulated machines (3 sessions each)");
  app.add_option("--heartbeat", o.heartbeat_s, "heartbeat interval, seconds");
  app.add_option("--rest", o.rest_s, "seconds of each rest phase");
  app.add_option("--jobs", o.jobs, "jobs to create");
  app.add_option("--tasks", o.tasks, "tasks per job");
  app.add_option("--clients", o.clients, "job.create callers at once");
  app.add_option("--create-rate", o.create_rate,
                 "create: jobs a second in all, paced (0: as fast as the callers go)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--task-cpu-milli", o.task_cpu_milli, "each task's CPU request");
  app.add_option("--task-mem-mb", o.task_mem_mb, "each task's memory request");
  app.add_option("--fail-percent", o.fail_percent, "share of machines that die in 'fail'");
  app.add_option("--run-delay-ms", o.run_delay_ms, "a task runs this long after task.run");
  app.add_option("--run-fail", o.run_fail, "share of task.run calls refused");
  app.add_option("--connect-window", o.connect_window, "connections in flight at once");
  app.add_option("--daemons", o.daemons, "sessions per machine: 3 (agent, sidekick, hcs) or 1")
      ->check(CLI::Range(1, 3));
  app.add_flag("--tls", o.tls, "mutual TLS (a certificate per machine)");
  app.add_flag("--loud-heartbeats", o.loud_heartbeats,
               "every heartbeat a request, as agents before issue 46 (none unanswered)");
  app.add_flag("--full-reports", o.full_reports,
               "report the whole task list every heartbeat (agents before issue 14)");
  app.add_option("--phases", o.phases,
                 "register,rest,create,rest,fail (in order); also fig14, discovery");
  app.add_option("--dns-interest", o.dns_interest,
                 "the agents answer DNS: \"all\" (told of every job) or a comma list of "
                 "jobs (told of those: pushes by interest); default: only in the discovery "
                 "phase, every job");
  app.add_option("--discovery-tasks", o.discovery_tasks, "discovery: the job's tasks");
  app.add_option("--discovery-steps", o.discovery_steps, "discovery: scale-downs timed");
  app.add_option("--cp-config", o.cp_extra, "extra controlplane.toml lines");
  app.add_option("--machine-data", o.data, "Alibaba machine_meta.csv");
  app.add_option("--timeout", o.timeout_s, "seconds each phase may take");
  app.add_option("--seed", o.seed, "random seed (the failing machines)");
  app.add_option("--region-etcd", o.region_etcd,
                 "a region on this etcd (http://host:port): the control plane as a shard, "
                 "with a front end");
  app.add_option("--jobs-via", o.jobs_via, "region: job.create through 'front-end' or 'shard'")
      ->check(CLI::IsMember({"front-end", "shard"}));
  app.add_option("--region-role", o.region_role,
                 "region: the control plane as 'shard' (with a front end) or 'broker' (its "
                 "machines free; register and rest only)")
      ->check(CLI::IsMember({"shard", "broker"}));
  app.add_flag("--keep", o.keep, "keep the control plane's directory (log, state)");
  app.add_option("--machine-cpu-milli", o.machine_cpu_milli, "every machine's CPU (0: the list's)");
  app.add_option("--machine-mem-mb", o.machine_mem_mb, "every machine's memory (0: the list's)");
  app.add_option("--domain-size", o.domain_size, "machines per fault domain (0: the list's)");
  app.add_option("--max-unavailable", o.max_unavailable, "fig14: the job's max_unavailable");
  app.add_option("--shards", o.shards, "fig14: shards over the job's tasks");
  app.add_option("--replicas", o.replicas, "fig14: replicas per shard");
  app.add_option("--floor", o.floor, "fig14: replicas a shard keeps (the controller's floor)");
  app.add_option("--max-in-flight", o.max_in_flight, "fig14: the controller's own pacing");
  app.add_option("--controller", o.controller,
                 "fig14: shard_controller binary (none: max_unavailable pacing only)");
  app.add_option("--scale", o.scale, "fig14: the timeline (T120, T415) times this");
  app.add_option("--out", o.out, "fig14: per-second CSV");
  app.add_flag("--expect-floor", o.expect_floor,
               "fig14: exit 1 if a shard had two or more replicas down outside the failure "
               "window (the test of TaskControl)");
  CLI11_PARSE(app, argc, argv);
  if (o.region_role == "broker") {
    for (const auto& ph : split(o.phases, ','))
      if (ph != "register" && ph != "rest") {
        std::fprintf(stderr, "fleet_sim: --region-role broker runs register and rest only\n");
        return 2;
      }
    if (o.region_etcd.empty()) {
      std::fprintf(stderr, "fleet_sim: --region-role needs --region-etcd\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LogLevel::kError);
  // The simulator's sessions and the control plane's (which inherits the limit).
  uint64_t want_fds = static_cast<uint64_t>(o.machines) * static_cast<uint64_t>(o.daemons) + 512;
  if (!raise_nofile(want_fds)) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    std::fprintf(stderr,
                 "fleet_sim: %d machines x %d sessions need %llu descriptors per process; this "
                 "process may have %llu (raising the hard limit needs CAP_SYS_RESOURCE)\n",
                 o.machines, o.daemons, static_cast<unsigned long long>(want_fds),
                 static_cast<unsigned long long>(rl.rlim_max));
    return 2;
  }
  auto shapes = read_shapes(o.data);
  if (shapes.empty() && o.machine_cpu_milli > 0 && o.machine_mem_mb > 0 && o.domain_size > 0)
    shapes.push_back(Shape{o.machine_cpu_milli, o.machine_mem_mb, "fd0", "dc1"});  // all given
  if (shapes.empty()) {
    std::fprintf(stderr, "fleet_sim: no machine shapes in %s\n", o.data.c_str());
    return 2;
  }
  std::string dir = std::filesystem::temp_directory_path() / ("weft-fleet-" + random_hex(5));
  std::string pki = dir + "/pki";
  (void)mkdir_p(dir);
  if (o.tls) {
    std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
    if (std::system(("(" + tool + " ca " + pki + " && " + tool + " issue " + pki +
                     " cp --ip 127.0.0.1) >/dev/null")
                        .c_str()) != 0 ||
        !issue_machine_certs(pki, o.machines)) {
      std::fprintf(stderr, "fleet_sim: could not make certificates in %s\n", pki.c_str());
      return 1;
    }
  }
  uint16_t port = weft::testing::free_tcp_port();
  std::string conf =
      "socket = \"" + dir + "/cp.sock\"\nstate_dir = \"" + dir +
      "/state\"\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\nheartbeat_interval = \"" +
      std::to_string(static_cast<int>(o.heartbeat_s * 1000)) +
      "ms\"\nlog_level = \"warning\"\nmetrics_listen = \"127.0.0.1:0\"\n" + o.cp_extra + "\n";
  if (o.tls)
    conf += "tls_ca = \"" + pki + "/ca.pem\"\ntls_cert = \"" + pki + "/cp.pem\"\ntls_key = \"" +
            pki + "/cp.key\"\n";
  // A region: the control plane is shard s1; a front end routes to it.
  pid_t fe = -1;
  std::string api = dir + "/cp.sock", jobs_api = api;
  bool broker = !o.region_etcd.empty() && o.region_role == "broker";
  if (broker) {
    std::string prefix = "/bench-" + random_hex(4) + "/";
    conf += "[store]\nkind = \"etcd\"\netcd_endpoints = [\"" + o.region_etcd +
            "\"]\netcd_prefix = \"" + prefix +
            "broker/\"\netcd_max_txn_ops = 4096\n[region]\nrole = \"broker\"\nprefix = \"" +
            prefix + "region/\"\n[region.shards]\ns1 = \"" + dir + "/no-shard.sock\"\n";
  } else if (!o.region_etcd.empty()) {
    std::string prefix = "/bench-" + random_hex(4) + "/";
    conf += "[store]\nkind = \"etcd\"\netcd_endpoints = [\"" + o.region_etcd +
            "\"]\netcd_prefix = \"" + prefix +
            "s1/\"\netcd_max_txn_ops = 4096\n[region]\nrole = "
            "\"shard\"\nshard = \"s1\"\nprefix = \"" +
            prefix + "region/\"\n";
    std::string fe_conf = "socket = \"" + dir + "/fe.sock\"\nstate_dir = \"" + dir +
                          "/fe\"\nlisten = \"\"\nlog_level = \"warning\"\nmetrics_listen = \"\"\n"
                          "[store]\nkind = \"etcd\"\netcd_endpoints = [\"" +
                          o.region_etcd + "\"]\n[region]\nrole = \"front-end\"\nprefix = \"" +
                          prefix + "region/\"\n[region.shards]\ns1 = \"" + dir + "/cp.sock\"\n";
    (void)write_file(dir + "/fe.toml", fe_conf);
    api = dir + "/fe.sock";
    if (o.jobs_via == "front-end") jobs_api = api;
  }
  (void)write_file(dir + "/cp.toml", conf);
  pid_t cp = start_controlplane(dir + "/cp.toml", dir + "/cp.log");
  if (broker)
    std::printf("fleet_sim: a region on %s: the control plane as its broker\n",
                o.region_etcd.c_str());
  if (!o.region_etcd.empty() && !broker) {
    fe = start_controlplane(dir + "/fe.toml", dir + "/fe.log");
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {  // the front end up and reaching its shard
      auto c = rpc::Client::connect(api);
      auto st =
          c.ok() ? (*c)->call("controlplane.status", json::object()) : Result<json>(c.error());
      up = st.ok() && st->contains("shards") && (*st)["shards"][0].value("connected", false);
      if (!up) ::usleep(100'000);
    }
    if (!up) {
      std::fprintf(stderr, "fleet_sim: the front end did not reach its shard; see %s/fe.log\n",
                   dir.c_str());
      for (pid_t p : {fe, cp}) kill(p, SIGTERM), waitpid(p, nullptr, 0);
      return 1;
    }
    std::printf("fleet_sim: a region on %s: shard s1 and a front end; jobs through the %s\n",
                o.region_etcd.c_str(), o.jobs_via.c_str());
  }
  if (!wait_controlplane(dir + "/cp.sock")) {
    std::fprintf(stderr, "fleet_sim: the control plane did not start; see %s/cp.log\n",
                 dir.c_str());
    kill(cp, SIGTERM);
    waitpid(cp, nullptr, 0);
    return 1;
  }
  std::printf(
      "fleet_sim: %d machines (%zu Alibaba shapes), heartbeat %.1f s, %s, %s reports, "
      "%ld CPUs\n",
      o.machines, shapes.size(), o.heartbeat_s, o.tls ? "mutual TLS" : "plaintext TCP",
      o.full_reports ? "full" : "change and digest", sysconf(_SC_NPROCESSORS_ONLN));
  auto loop = std::move(EventLoop::create()).value();
  Fleet fleet(*loop, o, port);
  for (int i = 0; i < o.machines; ++i) {
    Shape s = shapes[static_cast<size_t>(i) % shapes.size()];
    // Copies of the list beyond its 4,034 machines get their own racks.
    if (static_cast<size_t>(i) >= shapes.size())
      s.domain += "-" + std::to_string(static_cast<size_t>(i) / shapes.size());
    if (o.machine_cpu_milli > 0) s.cpu_milli = o.machine_cpu_milli;
    if (o.machine_mem_mb > 0) s.mem_mb = o.machine_mem_mb;
    if (o.domain_size > 0) s.domain = "msb" + std::to_string(i / o.domain_size);
    if (auto st = fleet.add(i, s, pki); !st.ok()) {
      std::fprintf(stderr, "fleet_sim: %s\n", st.error().str().c_str());
      if (fe > 0) kill(fe, SIGTERM);
      kill(cp, SIGTERM);  // the control plane does not outlive the simulator
      waitpid(cp, nullptr, 0);
      return 1;
    }
  }
  auto pump = [&] { fleet.pump(); };
  std::mt19937 rng(o.seed);
  int status = 0;
  size_t want_running = 0;
  auto measure = [&](const char* name, auto&& body) {
    Phase p{name};
    double cpu0 = cpu_seconds(cp);
    uint64_t msgs0 = fleet.messages();
    (void)fleet.take_rtts();
    uint64_t t0 = now_monotonic_us();
    std::string extra = body();
    p.seconds = static_cast<double>(now_monotonic_us() - t0) / 1e6;
    p.cp_cpu = cpu_seconds(cp) - cpu0;
    p.rss_mib = rss_kib(cp) / 1024;
    p.msgs_per_s = p.seconds > 0 ? static_cast<double>(fleet.messages() - msgs0) / p.seconds : 0;
    p.rtt = fleet.take_rtts();
    print_phase(p, extra);
  };
  for (const auto& phase : split(o.phases, ',')) {
    if (phase == "register") {
      measure("register", [&] {
        double s = run_until(
            *loop, [&] { return fleet.daemons_up() == fleet.sessions_wanted(); }, o.timeout_s,
            pump);
        if (s < 0) status = 1;
        return std::to_string(fleet.daemons_up()) + " of " +
               std::to_string(fleet.sessions_wanted()) + " daemon sessions up" +
               (s < 0 ? " (TIMEOUT)" : "");
      });
    } else if (phase == "rest") {
      measure("rest", [&] {
        run_until(
            *loop, [] { return false; }, o.rest_s, pump);
        return std::to_string(fleet.full_reports()) + " full, " +
               std::to_string(fleet.change_reports()) + " change and " +
               std::to_string(fleet.digest_reports()) + " digest reports (" +
               std::to_string(fleet.quiet_reports()) + " unanswered) so far, " +
               std::to_string(fleet.report_errors()) + " errors";
      });
    } else if (phase == "create") {
      auto admin = rpc::Client::connect(api);
      if (!admin.ok() ||
          !(*admin)->call("entitlement.create", {{"name", "fleet"}, {"quota", o.machines}}).ok()) {
        std::fprintf(stderr, "fleet_sim: entitlement.create failed\n");
        status = 1;
        break;
      }
      Creator creator;
      double created_s = 0;
      double fe_cpu0 = fe > 0 ? cpu_seconds(fe) : 0;
      measure("create", [&] {
        uint64_t t0 = now_monotonic_us();
        creator.start(jobs_api, o);
        run_until(
            *loop, [&] { return creator.done + creator.failed == o.jobs; }, o.timeout_s, pump);
        created_s = static_cast<double>(now_monotonic_us() - t0) / 1e6;
        want_running += static_cast<size_t>(creator.done) * static_cast<size_t>(o.tasks);
        double all = run_until(
            *loop, [&] { return fleet.running() >= want_running; }, o.timeout_s, pump);
        creator.join();
        if (creator.failed > 0 || all < 0) status = 1;
        char buf[512];
        std::snprintf(
            buf, sizeof buf,
            "%d jobs x %d tasks in %.2f s = %.0f jobs/s (%.0f tasks/s), job.create "
            "p50 %.1f ms p99 %.1f ms, %d failed%s%s; all %zu tasks running %s%.2f s "
            "after the last job",
            creator.done.load(), o.tasks, created_s, created_s > 0 ? creator.done / created_s : 0,
            created_s > 0 ? creator.done * o.tasks / created_s : 0, pct(creator.latency_ms, 50),
            pct(creator.latency_ms, 99), creator.failed.load(),
            creator.first_error.empty() ? "" : ": ", creator.first_error.substr(0, 120).c_str(),
            want_running, all < 0 ? "NOT " : "", all < 0 ? o.timeout_s : all);
        std::string out = buf;
        if (fe > 0) {
          std::snprintf(buf, sizeof buf, "; front end %.2f s CPU, %ld MiB RSS",
                        cpu_seconds(fe) - fe_cpu0, rss_kib(fe) / 1024);
          out += buf;
        }
        return out;
      });
    } else if (phase == "fail") {
      measure("fail", [&] {
        size_t n = fleet.kill(o.fail_percent / 100, rng);
        size_t lost = fleet.lost_total();
        double s = run_until(
            *loop, [&] { return fleet.lost_waiting() == 0; }, o.timeout_s, pump);
        auto r = fleet.replaced_ms();
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "%zu machines died with %zu tasks; replaced %zu: after death p50 %.2f s "
                      "p99 %.2f s max %.2f s%s",
                      n, lost, r.size(), pct(r, 50) / 1e3, pct(r, 99) / 1e3, pct(r, 100) / 1e3,
                      s < 0 ? " (NOT ALL within the timeout)" : "");
        if (s < 0) status = 1;
        return std::string(buf);
      });
      want_running = fleet.running();
    } else if (phase == "discovery") {
      if (discovery(*loop, fleet, o, dir, pump) != 0) status = 1;
    } else if (phase == "fig14") {
      if (fig14(*loop, fleet, o, dir, pump) != 0) status = 1;
    } else {
      std::fprintf(stderr, "fleet_sim: unknown phase '%s'\n", phase.c_str());
      status = 2;
      break;
    }
  }
  if (fe > 0) kill(fe, SIGTERM), waitpid(fe, nullptr, 0);
  kill(cp, SIGTERM);
  int ws = 0;
  waitpid(cp, &ws, 0);
  if (status != 0 || o.keep)
    std::printf("fleet_sim: control plane log kept in %s/cp.log\n", dir.c_str());
  else
    (void)remove_tree(dir);
  return status;
}
