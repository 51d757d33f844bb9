// A region on this machine against the fleet simulator (issue 45; docs/benchmarks.md): a
// broker, three shards and a front end (weft-controlplane processes on the etcd given by
// --etcd, as bench/region_move.sh starts it), and --machines simulated machines (one
// session each) that register with the broker and follow "moved" to the shard that
// borrows them, as the daemons' links do.
//
// Phases:
//   register  every machine registers (with the broker: the free pool)
//   move      entitlement "moving" of --move-machines machines with --move-jobs jobs of
//             --move-tasks tasks on s1, entitlement "steady" on s3 taking a job.create
//             every 50 ms; then --moves moves of "moving" between s1 and s2 through the
//             front end. Each move: its scheduling pause (from the old shard's fence to
//             the new shard's open, as the front end measured it), its whole time, the
//             time until every machine with its tasks reports to the new shard, and the
//             task.run calls meanwhile (a restart: there must be none); s3's job.create
//             latency before the moves and during them
//   spread    --jobs jobs of --tasks tasks through the front end into --spread-shards
//             entitlements, one per shard (1: all on s1; 3: one on each): jobs/s
//   hold      --hold-machines machines split over three entitlements, one per shard,
//             then --rest seconds at rest: each role's CPU, RSS, descriptors
//
//   build/bench/region_bench --etcd http://127.0.0.1:2379 --machines 1100 --phases register,move
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>

#include "bench/fleet.h"
#include "bench/sim_util.h"

using namespace weft;
using namespace weft::bench;
using namespace weft::bench::fleet;

namespace {

struct RegionOptions {
  std::string etcd;
  int move_machines = 1000, move_jobs = 10, move_tasks = 1000, moves = 5;
  int steady_machines = 20;
  int spread_shards = 3;
  int hold_machines = 0;
  uint16_t attach = 0;     // join an existing region's broker (no processes of our own)
  int first = 0;           // the first machine's index (attach: after the other process's)
  std::string dc = "dc1";  // the machines' datacenter (dc2: broker2's machines)
};

struct Proc {
  std::string name, sock;
  uint16_t port = 0;
  pid_t pid = -1;
};

int fds_of(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// Runs `call` on a thread of its own (it blocks on the front end) while the fleet's loop
// serves the machines; its result.
template <class Call>
Result<json> off_loop(EventLoop& loop, Fleet& fleet, Call call) {
  std::atomic<bool> done{false};
  Result<json> out = make_error("not run");
  std::thread t([&] {
    out = call();
    done = true;
  });
  run_until(
      loop, [&] { return done.load(); }, 3600, [&] { fleet.pump(); });
  t.join();
  return out;
}

Result<json> fe_call(const std::string& sock, const std::string& method, const json& p,
                     int timeout_ms = 120'000) {
  auto c = rpc::Client::connect(sock);
  if (!c.ok()) return c.error();
  return (*c)->call(method, p, timeout_ms);
}

json job(const std::string& name, const std::string& ent, int count, const Options& o) {
  return {{"name", name},
          {"entitlement", ent},
          {"count", count},
          {"per_task", {{"cpu_milli", o.task_cpu_milli}, {"mem_mb", o.task_mem_mb}}},
          {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
}

// Creates a job through the front end, again while it does not fit yet (the shard is
// still borrowing its machines).
Status create_when_fits(const std::string& fe, const json& spec, double timeout_s) {
  uint64_t end = now_monotonic_us() + static_cast<uint64_t>(timeout_s * 1e6);
  Result<json> r = make_error("not tried");
  while (now_monotonic_us() < end) {
    r = fe_call(fe, "job.create", spec);
    if (r.ok()) return {};
    ::usleep(500'000);
  }
  return r.error();
}

// A job.create every `every_ms` into `ent` until stopped: each one's latency.
struct Stream {
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<double> ms;
  int failed = 0;
  std::thread t;
  void start(const std::string& fe, const std::string& ent, const Options& o, int every_ms,
             std::atomic<int>* seq) {
    stop = false;
    t = std::thread([this, fe, ent, &o, every_ms, seq] {
      auto c = rpc::Client::connect(fe);
      while (!stop && c.ok()) {
        int n = (*seq)++;
        uint64_t t0 = now_monotonic_us();
        // Small tasks: the stream never fills its entitlement's machines.
        json spec = job("steady" + std::to_string(n), ent, 1, o);
        spec["per_task"] = {{"cpu_milli", 10}, {"mem_mb", 16}};
        auto r = (*c)->call("job.create", spec, 60'000);
        double took = static_cast<double>(now_monotonic_us() - t0) / 1e3;
        {
          std::lock_guard<std::mutex> g(mu);
          if (r.ok())
            ms.push_back(took);
          else
            ++failed;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
      }
    });
  }
  std::vector<double> finish(int* failures = nullptr) {
    stop = true;
    if (t.joinable()) t.join();
    std::lock_guard<std::mutex> g(mu);
    if (failures) *failures += std::exchange(failed, 0);
    return std::exchange(ms, {});
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"region_bench: a region (broker, three shards, front end) and simulated machines"};
  Options o;
  RegionOptions r;
  o.daemons = 1;
  o.machine_cpu_milli = 64000;
  o.machine_mem_mb = 262144;
  o.domain_size = 20;
  o.task_cpu_milli = 100;
  o.task_mem_mb = 64;
  o.phases = "register,move";
  app.add_option("--etcd", r.etcd, "the region's etcd (http://host:port)")->required();
  app.add_option("--machines", o.machines, "simulated machines (one session each)");
  app.add_option("--heartbeat", o.heartbeat_s, "heartbeat interval, seconds");
  app.add_option("--rest", o.rest_s, "seconds at rest (hold)");
  app.add_option("--jobs", o.jobs, "spread: jobs");
  app.add_option("--tasks", o.tasks, "spread: tasks per job");
  app.add_option("--clients", o.clients, "spread: job.create callers at once");
  app.add_option("--move-machines", r.move_machines, "move: the moving entitlement's machines");
  app.add_option("--task-cpu-milli", o.task_cpu_milli,
                 "each task's CPU request (machines have 64 cores)");
  app.add_option("--move-jobs", r.move_jobs, "move: its jobs");
  app.add_option("--move-tasks", r.move_tasks, "move: tasks per job");
  app.add_option("--moves", r.moves, "move: moves, each the other way");
  app.add_option("--steady-machines", r.steady_machines, "move: machines of s3's entitlement");
  app.add_option("--spread-shards", r.spread_shards, "spread: 1 or 3 shards")
      ->check(CLI::IsMember({1, 3}));
  app.add_option("--hold-machines", r.hold_machines, "hold: machines the shards borrow");
  app.add_option("--attach", r.attach,
                 "only machines, registering with this broker port (another region_bench's)");
  app.add_option("--first", r.first, "the first machine's index (with --attach)");
  app.add_option("--dc", r.dc, "the machines' datacenter (dc1: the broker's, dc2: broker2's)");
  app.add_option("--phases", o.phases, "register,move | register,spread | register,hold");
  app.add_option("--timeout", o.timeout_s, "seconds each phase may take");
  app.add_flag("--keep", o.keep, "keep the processes' directory (logs)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed (a script reads them)
  log_set_level(LogLevel::kError);
  // As many as this workplace allows a process (the region's processes inherit it).
  if (!raise_nofile(std::max<uint64_t>(static_cast<uint64_t>(o.machines) + 512, 19'500))) {
    std::fprintf(stderr, "region_bench: %d sessions need as many descriptors\n", o.machines);
    return 2;
  }
  std::string dir = std::filesystem::temp_directory_path() / ("weft-region-" + random_hex(5));
  (void)mkdir_p(dir);
  std::string prefix = "/bench-" + random_hex(4) + "/";
  // Two broker groups (datacenters dc1 and dc2): a broker holds the sessions of its free
  // machines, and one process may hold 20,000 descriptors, so a region of 30,000
  // machines needs two. This process's machines are dc1's (or, with --attach, the
  // given broker's).
  Proc broker{"broker"}, broker2{"broker2"}, fe{"fe"};
  std::vector<Proc> shards{{"s1"}, {"s2"}, {"s3"}};
  std::vector<Proc*> all{&broker, &broker2};
  for (auto& s : shards) all.push_back(&s);
  all.push_back(&fe);
  for (Proc* p : all) {
    p->sock = dir + "/" + p->name + ".sock";
    p->port = p == &fe ? 0 : weft::testing::free_tcp_port();
  }
  auto stop_all = [&] {
    for (Proc* p : all)
      if (p->pid > 0) kill(p->pid, SIGTERM);
    for (Proc* p : all)
      if (p->pid > 0) waitpid(p->pid, nullptr, 0);
  };
  if (!r.attach) {
    auto base = [&](const Proc& p) {
      return "socket = \"" + p.sock + "\"\nstate_dir = \"" + dir + "/" + p.name +
             "\"\nlisten = \"" + (p.port ? "127.0.0.1:" + std::to_string(p.port) : "") +
             "\"\nheartbeat_interval = \"" +
             std::to_string(static_cast<int>(o.heartbeat_s * 1000)) +
             "ms\"\nlog_level = \"info\"\nmetrics_listen = \"\"\ninsecure_listen = "
             "true\n[store]\nkind = \"etcd\"\n"
             "etcd_endpoints = [\"" +
             r.etcd + "\"]\netcd_prefix = \"" + prefix + p.name +
             "/\"\netcd_max_txn_ops = 4096\n[region]\nprefix = \"" + prefix + "region/\"\n";
    };
    std::string tcp_shards = "[region.shards]\n", unix_shards = "[region.shards]\n";
    for (const auto& s : shards) {
      tcp_shards += s.name + " = \"127.0.0.1:" + std::to_string(s.port) + "\"\n";
      unix_shards += s.name + " = \"" + s.sock + "\"\n";
    }
    // The roles reach each other on their Unix sockets (a plaintext TCP peer is not
    // trusted as a shard or a front end); the machines dial TCP, and the broker names
    // the shards' TCP listeners when it sends a machine there.
    std::string brokers =
        "[region.brokers]\ndc1 = \"" + broker.sock + "\"\ndc2 = \"" + broker2.sock + "\"\n";
    (void)write_file(dir + "/broker.toml",
                     base(broker) + "role = \"broker\"\ngroup = \"dc1\"\n" + tcp_shards);
    (void)write_file(dir + "/broker2.toml",
                     base(broker2) + "role = \"broker\"\ngroup = \"dc2\"\n" + tcp_shards);
    for (const auto& s : shards)
      (void)write_file(dir + "/" + s.name + ".toml", base(s) + "role = \"shard\"\nshard = \"" +
                                                         s.name + "\"\nreturn_idle = \"600s\"\n" +
                                                         brokers);
    (void)write_file(dir + "/fe.toml", base(fe) + "role = \"front-end\"\n" + unix_shards + brokers);
    for (Proc* p : all)
      p->pid = start_controlplane(dir + "/" + p->name + ".toml", dir + "/" + p->name + ".log");
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {
      auto st = fe_call(fe.sock, "controlplane.status", json::object(), 2000);
      up = st.ok() && st->contains("shards");
      if (up)
        for (const auto& s : (*st)["shards"]) up = up && s.value("connected", false);
      if (!up) ::usleep(100'000);
    }
    if (!up) {
      std::fprintf(stderr, "region_bench: the region did not come up; see %s\n", dir.c_str());
      stop_all();
      return 1;
    }
    std::printf("region_bench: broker port %u\nregion_bench: broker2 port %u\n", broker.port,
                broker2.port);
    std::fflush(stdout);
  } else {
    broker.port = r.attach;
  }
  std::printf("region_bench: %s; %d machines from m%05d, one session each, heartbeat %.1f s\n",
              r.attach
                  ? ("machines only, for the broker on port " + std::to_string(r.attach)).c_str()
                  : "a broker, shards s1 s2 s3 and a front end on one etcd",
              o.machines, r.first, o.heartbeat_s);
  auto loop = std::move(EventLoop::create()).value();
  Fleet fleet(*loop, o, broker.port);
  for (int i = 0; i < o.machines; ++i) {
    Shape s{o.machine_cpu_milli, o.machine_mem_mb,
            "msb" + std::to_string((r.first + i) / o.domain_size), r.dc};
    if (auto st = fleet.add(r.first + i, s, ""); !st.ok()) {
      std::fprintf(stderr, "region_bench: %s\n", st.error().str().c_str());
      stop_all();
      return 1;
    }
  }
  auto pump = [&] { fleet.pump(); };
  auto cpu = [&](const Proc& p) { return p.pid > 0 ? cpu_seconds(p.pid) : 0.0; };
  int status = 0;
  for (const auto& phase : split(o.phases, ',')) {
    if (phase == "register") {
      uint64_t t0 = now_monotonic_us();
      double s = run_until(
          *loop, [&] { return fleet.daemons_up() == fleet.sessions_wanted(); }, o.timeout_s, pump);
      std::printf("register  %zu of %zu machines up in %.1f s%s\n", fleet.daemons_up(),
                  fleet.sessions_wanted(), static_cast<double>(now_monotonic_us() - t0) / 1e6,
                  s < 0 ? " (TIMEOUT)" : "");
      if (s < 0) status = 1;
    } else if (phase == "rest") {
      run_until(
          *loop, [] { return false; }, o.rest_s, pump);
    } else if (phase == "move") {
      auto made = off_loop(*loop, fleet, [&]() -> Result<json> {
        TRY(fe_call(fe.sock, "entitlement.create",
                    {{"name", "moving"}, {"quota", r.move_machines}, {"shard", "s1"}}));
        TRY(fe_call(fe.sock, "entitlement.create",
                    {{"name", "steady"}, {"quota", r.steady_machines}, {"shard", "s3"}}));
        for (int j = 0; j < r.move_jobs; ++j)
          TRY(create_when_fits(fe.sock, job("mv" + std::to_string(j), "moving", r.move_tasks, o),
                               o.timeout_s));
        TRY(create_when_fits(fe.sock, job("steady-first", "steady", 1, o), o.timeout_s));
        return json::object();
      });
      if (!made.ok()) {
        std::fprintf(stderr, "region_bench: %s\n", made.error().str().c_str());
        status = 1;
        break;
      }
      size_t want = static_cast<size_t>(r.move_jobs) * static_cast<size_t>(r.move_tasks) + 1;
      double ran = run_until(
          *loop, [&] { return fleet.running() >= want; }, o.timeout_s, pump);
      std::printf("move      %d jobs x %d tasks on %d machines of s1, all running %s\n",
                  r.move_jobs, r.move_tasks, r.move_machines, ran < 0 ? "NOT (TIMEOUT)" : "");
      if (ran < 0) {
        status = 1;
        break;
      }
      run_until(
          *loop, [] { return false; }, 5, pump);
      std::atomic<int> seq{0};
      Stream before;
      before.start(fe.sock, "steady", o, 50, &seq);
      run_until(
          *loop, [] { return false; }, 10, pump);
      int quiet_failed = 0, during_failed = 0;
      auto quiet = before.finish(&quiet_failed);
      std::vector<double> pause_ms, whole_ms, follow_ms, during;
      uint64_t restarts = 0;
      for (int k = 0; k < r.moves; ++k) {
        const Proc& to = shards[k % 2 == 0 ? 1 : 0];
        const Proc& from = shards[k % 2 == 0 ? 0 : 1];
        uint64_t runs0 = fleet.task_runs("mv");
        double cpu_from = cpu(from), cpu_to = cpu(to), cpu_fe = cpu(fe);
        Stream stream;
        stream.start(fe.sock, "steady", o, 50, &seq);
        uint64_t t0 = now_monotonic_us();
        auto moved = off_loop(*loop, fleet, [&] {
          return fe_call(fe.sock, "entitlement.move", {{"name", "moving"}, {"to", to.name}},
                         600'000);
        });
        double whole = static_cast<double>(now_monotonic_us() - t0) / 1e3;
        double follow = run_until(
            *loop,
            [&] {
              auto [with, there] = fleet.hosting("mv", to.port);
              return with > 0 && with == there && fleet.running() >= want;
            },
            o.timeout_s, pump);
        double followed = static_cast<double>(now_monotonic_us() - t0) / 1e3;
        auto lat = stream.finish(&during_failed);
        during.insert(during.end(), lat.begin(), lat.end());
        uint64_t runs = fleet.task_runs("mv") - runs0;
        restarts += runs;
        if (!moved.ok() || follow < 0) {
          std::printf("move %d   %s -> %s FAILED: %s\n", k + 1, from.name.c_str(), to.name.c_str(),
                      moved.ok() ? "the machines did not all follow" : moved.error().str().c_str());
          status = 1;
          break;
        }
        double pause = moved->value("fenced_ms", 0.0);
        pause_ms.push_back(pause);
        whole_ms.push_back(whole);
        follow_ms.push_back(followed);
        std::printf(
            "move %d   %s -> %s: %d machines, %d tasks, a document of %.1f MB, paused %.0f ms, "
            "answered after %.0f ms, "
            "every machine at %s after %.0f ms, task.run of its tasks meanwhile %llu | CPU s %s "
            "%.2f, %s "
            "%.2f, fe %.2f\n",
            k + 1, from.name.c_str(), to.name.c_str(), moved->value("machines", 0),
            moved->value("tasks", 0), moved->value("document_bytes", 0.0) / 1e6, pause, whole,
            to.name.c_str(), followed, static_cast<unsigned long long>(runs), from.name.c_str(),
            cpu(from) - cpu_from, to.name.c_str(), cpu(to) - cpu_to, cpu(fe) - cpu_fe);
        std::fflush(stdout);
        run_until(
            *loop, [] { return false; }, 3, pump);
      }
      std::printf(
          "moves     %zu: pause p50 %.0f ms p99 %.0f ms max %.0f ms; answered p50 %.0f ms; every "
          "machine there p50 %.0f ms max %.0f ms; restarts %llu\n",
          pause_ms.size(), pct(pause_ms, 50), pct(pause_ms, 99), pct(pause_ms, 100),
          pct(whole_ms, 50), pct(follow_ms, 50), pct(follow_ms, 100),
          static_cast<unsigned long long>(restarts));
      std::printf(
          "s3        job.create through the front end: before the moves p50 %.1f ms p99 %.1f ms "
          "(%zu, %d failed), during them p50 %.1f ms p99 %.1f ms (%zu, %d failed)\n",
          pct(quiet, 50), pct(quiet, 99), quiet.size(), quiet_failed, pct(during, 50),
          pct(during, 99), during.size(), during_failed);
      if (quiet_failed + during_failed > 0) status = 1;
      if (restarts > 0) status = 1;
    } else if (phase == "spread") {
      int n = r.spread_shards;
      auto made = off_loop(*loop, fleet, [&]() -> Result<json> {
        for (int i = 0; i < n; ++i)
          TRY(fe_call(fe.sock, "entitlement.create",
                      {{"name", "sp" + std::to_string(i)},
                       {"quota", o.machines / n},
                       {"shard", shards[static_cast<size_t>(i)].name}}));
        for (int i = 0; i < n; ++i)
          TRY(create_when_fits(fe.sock,
                               job("warm" + std::to_string(i), "sp" + std::to_string(i), 1, o),
                               o.timeout_s));
        return json::object();
      });
      if (!made.ok()) {
        std::fprintf(stderr, "region_bench: %s\n", made.error().str().c_str());
        status = 1;
        break;
      }
      size_t want = static_cast<size_t>(n);
      run_until(
          *loop, [&] { return fleet.running() >= want; }, o.timeout_s, pump);
      std::vector<double> cpu0;
      for (const auto& s : shards) cpu0.push_back(cpu(s));
      double fe0 = cpu(fe);
      std::atomic<int> done{0}, failed{0};
      std::mutex mu;
      std::vector<double> lat;
      uint64_t t0 = now_monotonic_us();
      std::vector<std::thread> callers;
      for (int c = 0; c < o.clients; ++c)
        callers.emplace_back([&, c] {
          auto cl = rpc::Client::connect(fe.sock);
          for (int j = c; j < o.jobs && cl.ok(); j += o.clients) {
            uint64_t s0 = now_monotonic_us();
            auto res = (*cl)->call(
                "job.create",
                job("j" + std::to_string(j), "sp" + std::to_string(j % n), o.tasks, o), 120'000);
            std::lock_guard<std::mutex> g(mu);
            lat.push_back(static_cast<double>(now_monotonic_us() - s0) / 1e3);
            (res.ok() ? done : failed)++;
          }
        });
      std::atomic<bool> joined{false};
      std::thread waiter([&] {
        for (auto& t : callers) t.join();
        joined = true;
      });
      run_until(
          *loop, [&] { return joined.load(); }, o.timeout_s, pump);
      waiter.join();
      double secs = static_cast<double>(now_monotonic_us() - t0) / 1e6;
      want += static_cast<size_t>(done.load()) * static_cast<size_t>(o.tasks);
      double ran = run_until(
          *loop, [&] { return fleet.running() >= want; }, o.timeout_s, pump);
      std::printf(
          "spread    %d shard(s): %d jobs x %d tasks in %.2f s = %.0f jobs/s, job.create p50 %.1f "
          "ms p99 %.1f ms, %d failed; all running %s%.2f s after the last | CPU s:",
          n, done.load(), o.tasks, secs, secs > 0 ? done / secs : 0, pct(lat, 50), pct(lat, 99),
          failed.load(), ran < 0 ? "NOT " : "", ran < 0 ? o.timeout_s : ran);
      for (size_t i = 0; i < shards.size(); ++i)
        std::printf(" %s %.2f", shards[i].name.c_str(), cpu(shards[i]) - cpu0[i]);
      std::printf(", fe %.2f\n", cpu(fe) - fe0);
      if (failed > 0 || ran < 0) status = 1;
    } else if (phase == "hold") {
      if (!r.attach) {
        auto made = off_loop(*loop, fleet, [&]() -> Result<json> {
          for (size_t i = 0; i < shards.size(); ++i)
            TRY(fe_call(fe.sock, "entitlement.create",
                        {{"name", "hold" + std::to_string(i)},
                         {"quota", r.hold_machines / 3},
                         {"shard", shards[i].name}}));
          return json::object();
        });
        if (!made.ok()) {
          std::fprintf(stderr, "region_bench: %s\n", made.error().str().c_str());
          status = 1;
          break;
        }
        // Until the shards hold what they asked for (each machine's session at its shard).
        uint64_t t0 = now_monotonic_us();
        // (this process's machines: another process's half are its own to count)
        size_t want =
            std::min<size_t>(static_cast<size_t>(r.hold_machines / 3 * 3), fleet.machines());
        double s = run_until(
            *loop, [&] { return fleet.up_elsewhere() >= want; }, o.timeout_s, pump);
        std::printf("hold      the shards borrowed %zu machines in %.1f s%s\n",
                    fleet.up_elsewhere(), static_cast<double>(now_monotonic_us() - t0) / 1e6,
                    s < 0 ? " (TIMEOUT)" : "");
      }
      std::vector<double> c0;
      for (Proc* p : all) c0.push_back(cpu(*p));
      uint64_t m0 = fleet.messages();
      run_until(
          *loop, [] { return false; }, o.rest_s, pump);
      double rate = static_cast<double>(fleet.messages() - m0) / o.rest_s;
      std::printf(
          "rest      %.0f s, this process's %zu machines sent %.0f msg/s (%.2f a machine); "
          "per role:\n",
          o.rest_s, fleet.machines(), rate, rate / static_cast<double>(fleet.machines()));
      for (size_t i = 0; i < all.size(); ++i)
        if (all[i]->pid > 0)
          std::printf("  %-7s CPU %5.1f%% of a core, RSS %5ld MiB, %6d descriptors\n",
                      all[i]->name.c_str(), 100 * (cpu(*all[i]) - c0[i]) / o.rest_s,
                      rss_kib(all[i]->pid) / 1024, fds_of(all[i]->pid));
    } else {
      std::fprintf(stderr, "region_bench: unknown phase '%s'\n", phase.c_str());
      status = 2;
      break;
    }
  }
  stop_all();
  if (status != 0 || o.keep)
    std::printf("region_bench: logs kept in %s\n", dir.c_str());
  else
    (void)remove_tree(dir);
  return status;
}
