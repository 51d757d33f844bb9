// Start-latency and footprint benchmark for weft-agent, side by side with crun.
//
//   sudo build/bench/start_bench [--seq N] [--conc N] [--rounds N] [--bursts N] [--resident N]
//                                [--idle-seconds S] [--no-crun]
//
// Prints, for one run on this machine:
//  - agent-side start latency (task.run accepted -> weft-init running in the task's
//    cgroup), p50/p99, sequential and N concurrent clients; plus what the clients saw;
//  - like for like, until the task's own program runs (it writes to a fifo the
//    benchmark waits on): `weftctl task run`, a task.run request on the agent's socket
//    (what the control plane sends) and `crun run -d`, with the same static program in
//    the same busybox rootfs, the same namespaces (pid, mount, uts, ipc, net), user
//    (nobody), masked/read-only paths and seccomp deny list, one cgroup each; one at a
//    time and N at once, p50/p90/p99 and the ratios to crun; where the agent's time
//    went (its start_phases_us) and each CLI's own start;
//  - with R resident tasks: agent RSS, agent CPU while idle, per-task weft-init RSS/PSS.
// Needs root. Cleans up every task, cgroup and file it makes.
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "agent/init/task_filter_rules.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc/client.h"
#include "common/strings.h"

using json = nlohmann::json;
using namespace weft;
using namespace weft::bench;

namespace {

uint64_t status_kb(pid_t pid, const char* key) {
  auto s = read_file("/proc/" + std::to_string(pid) + "/status");
  if (!s.ok()) return 0;
  for (const auto& line : split(*s, '\n'))
    if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + std::strlen(key), nullptr, 10);
  return 0;
}

uint64_t pss_kb(pid_t pid) {
  auto s = read_file("/proc/" + std::to_string(pid) + "/smaps_rollup");
  if (!s.ok()) return 0;
  for (const auto& line : split(*s, '\n'))
    if (line.rfind("Pss:", 0) == 0) return std::strtoull(line.c_str() + 4, nullptr, 10);
  return 0;
}

uint64_t cpu_ticks(pid_t pid) {
  auto s = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!s.ok()) return 0;
  auto f = split(s->substr(s->rfind(')') + 2), ' ');
  return std::strtoull(f[11].c_str(), nullptr, 10) + std::strtoull(f[12].c_str(), nullptr, 10);
}

// crun (1.8) refuses a host whose /sys/fs/cgroup is the hybrid layout's tmpfs. Rather
// than wrap each crun (and, to be fair, each weftctl) in a mount-namespace script, the
// benchmark enters one private mount namespace whose /sys/fs/cgroup is the cgroup2 tree
// (the same hierarchy) before it starts anything: the agent, weftctl and crun all run
// in it, unwrapped. It ends with the benchmark.
void own_cgroup2_view() {
  struct statfs fs {};
  if (statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC) return;
  if (unshare(CLONE_NEWNS) < 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0 ||
      umount2("/sys/fs/cgroup", MNT_DETACH) < 0 ||
      mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) <
          0) {
    std::fprintf(stderr, "start_bench: cannot mount cgroup2 at /sys/fs/cgroup: %s\n",
                 std::strerror(errno));
    std::exit(1);
  }
}

class Bench {
 public:
  Bench() {
    dir_ = std::filesystem::temp_directory_path() / ("weft-bench-" + random_hex(4));
    (void)mkdir_p(dir_ + "/rootfs/bin");
    (void)mkdir_p(dir_ + "/bundle");
    if (system(("cp /bin/busybox " + dir_ + "/rootfs/bin/busybox").c_str()) != 0)
      die("needs /bin/busybox (busybox-static)");
    symlink("busybox", (dir_ + "/rootfs/bin/sleep").c_str());
    symlink("busybox", (dir_ + "/rootfs/bin/sh").c_str());
    symlink("busybox", (dir_ + "/rootfs/bin/true").c_str());
    if (system(("cp " START_MARKER_BIN " " + dir_ + "/rootfs/bin/start_marker").c_str()) != 0)
      die("cannot copy start_marker");
    cg_root_ =
        HostPaths().cgroup2_mount().value_or("/sys/fs/cgroup") + "/weft-bench-" + random_hex(4);
    sock_ = dir_ + "/agent.sock";
    // crun keeps its containers' state where it does by default, under /run (/run/crun);
    // weft its tasks' directories in its state_dir (/var/lib/weft by default). Where
    // /run is a tmpfs that is crun's advantage to keep; on the development VM /run is on
    // the same ext4 as /tmp, and crun's state under either gave the same figures.
    crun_root_ = "/run/weft-bench-" + random_hex(4) + "/crun";
    (void)write_file(dir_ + "/agent.toml", "socket = \"" + sock_ + "\"\nstate_dir = \"" + dir_ +
                                               "/state\"\ncgroup_root = \"" + cg_root_ +
                                               "\"\ninit_path = \"" + WEFT_INIT_BIN + "\"\n");
  }
  ~Bench() {
    kill_process(agent_);
    remove_cgroup_tree(cg_root_);
    (void)remove_tree(dir_);
    (void)remove_tree(crun_root_.substr(0, crun_root_.rfind('/')));
  }
  [[noreturn]] static void die(const std::string& m) {
    std::fprintf(stderr, "start_bench: %s\n", m.c_str());
    std::exit(1);
  }

  // agent.toml's netns_pool and sandbox_pool (-1: the agent's default): how much the
  // namespaces and sandboxes made ahead are worth, from the benchmark itself.
  void start_agent(int netns_pool, int sandbox_pool) {
    for (auto [key, value] :
         {std::pair{"netns_pool", netns_pool}, {"sandbox_pool", sandbox_pool}}) {
      if (value < 0) continue;
      auto conf = read_file(dir_ + "/agent.toml");
      if (!conf.ok() ||
          !write_file(dir_ + "/agent.toml", *conf + key + " = " + std::to_string(value) + "\n")
               .ok())
        die("cannot write agent.toml");
    }
    agent_ = start_agent_process(WEFT_AGENT_BIN, dir_, sock_);
    if (agent_ < 0) die("agent did not start; see " + dir_ + "/agent.log");
  }

  json spec(const std::string& name, bool rootfs) {
    json s{{"name", name}, {"argv", {"/bin/sleep", "100000"}}};
    if (rootfs) {
      s["rootfs"] = dir_ + "/rootfs";
      s["namespaces"] = {{"network", "private"}};
    }
    return s;
  }

  // Stops and forgets every task.
  void clear_tasks() {
    auto c = std::move(rpc::Client::connect(sock_)).value();
    json ls = c->call("task.ls", json::object()).value_or(json{{"tasks", json::array()}});
    for (const auto& t : ls["tasks"]) (void)c->call("task.stop", {{"id", t["id"]}, {"grace", 0}});
    for (int i = 0; i < 3000; ++i) {
      json l = c->call("task.ls", json::object()).value_or(json{{"tasks", json::array()}});
      bool live = false;
      for (const auto& t : l["tasks"]) {
        std::string st = t["state"];
        live |= !(st == "exited" || st == "failed" || st == "stopped");
      }
      if (!live) break;
      usleep(10000);
    }
    json l = c->call("task.ls", json::object()).value_or(json{{"tasks", json::array()}});
    for (const auto& t : l["tasks"]) (void)c->call("task.remove", {{"id", t["id"]}});
  }

  void weft_sequential(int n, std::vector<double>* agent_ms, std::vector<double>* client_ms) {
    auto c = std::move(rpc::Client::connect(sock_)).value();
    for (int i = 0; i < n; ++i) {
      uint64_t t0 = now_monotonic_us();
      auto r = c->call("task.run", spec("seq-" + std::to_string(i), true));
      double ms = ms_since(t0);
      if (!r.ok()) die("task.run: " + r.error().str());
      client_ms->push_back(ms);
      agent_ms->push_back((*r)["start_latency_us"].get<double>() / 1000.0);
    }
    clear_tasks();
  }

  void weft_concurrent(int n, int rounds, std::vector<double>* agent_ms,
                       std::vector<double>* client_ms) {
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::unique_ptr<rpc::Client>> clients;
      for (int i = 0; i < n; ++i) clients.push_back(std::move(rpc::Client::connect(sock_)).value());
      std::vector<double> a(n), cl(n);
      std::barrier sync(n);
      std::vector<std::thread> th;
      for (int i = 0; i < n; ++i)
        th.emplace_back([&, i] {
          sync.arrive_and_wait();
          uint64_t t0 = now_monotonic_us();
          auto res = clients[i]->call(
              "task.run", spec("c" + std::to_string(r) + "-" + std::to_string(i), true));
          cl[i] = ms_since(t0);
          a[i] = res.ok() ? (*res)["start_latency_us"].get<double>() / 1000.0 : -1;
        });
      for (auto& t : th) t.join();
      for (int i = 0; i < n; ++i) {
        if (a[i] < 0) die("a concurrent task.run failed");
        agent_ms->push_back(a[i]);
        client_ms->push_back(cl[i]);
      }
      clear_tasks();
    }
  }

  // An OCI bundle equivalent to weft's task, for crun.
  void crun_setup() {
    std::string b = dir_ + "/bundle";
    if (system(("cd " + b + " && crun spec >/dev/null").c_str()) != 0)
      die("crun spec failed (is crun installed?)");
    auto cfg = json::parse(*read_file(b + "/config.json"));
    cfg["process"]["args"] = {"/bin/sleep", "100000"};
    cfg["process"]["terminal"] = false;
    cfg["process"].erase("rlimits");
    cfg["root"] = {{"path", dir_ + "/rootfs"}, {"readonly", false}};
    // Equivalent to weft's task: no device-cgroup eBPF program (needs CAP_SYS_RESOURCE
    // here); user nobody, no_new_privs, masked/read-only paths (crun's defaults, as
    // weft's) and weft's seccomp deny list; the same mounts weft makes.
    cfg["linux"].erase("resources");
    cfg["process"]["user"] = {{"uid", 65534}, {"gid", 65534}};
    cfg["process"]["noNewPrivileges"] = true;
    json denied = json::array();
    for (int i = 0; i < weft_init::kDeniedSyscallCount; ++i)
      denied.push_back(weft_init::kDeniedSyscalls[i]);
    cfg["linux"]["seccomp"] = {
        {"defaultAction", "SCMP_ACT_ALLOW"},
        {"architectures", {"SCMP_ARCH_X86_64"}},
        {"syscalls", {{{"names", denied}, {"action", "SCMP_ACT_ERRNO"}, {"errnoRet", 1}}}}};
    json mounts = json::array();
    for (const auto& m : cfg["mounts"]) {
      std::string d = m["destination"];
      if (d == "/proc" || d == "/dev" || d == "/dev/pts" || d == "/dev/shm") mounts.push_back(m);
    }
    cfg["mounts"] = mounts;
    cfg["linux"].erase("cgroupsPath");  // crun makes one cgroup per container id
    (void)write_file(b + "/config.json", cfg.dump(1));
    crun_config_ = cfg;
  }

  // ---- until the task's own program runs ----

  // CPU time the whole machine has spent, in microseconds (the root cgroup's cpu.stat:
  // /sys/fs/cgroup is the cgroup2 tree in the benchmark's mount namespace).
  static uint64_t machine_cpu_us() {
    auto text = read_file("/sys/fs/cgroup/cpu.stat");
    if (!text.ok()) return 0;
    unsigned long long us = 0;
    if (std::sscanf(text->c_str(), "usage_usec %llu", &us) != 1) return 0;
    return us;
  }

  // Waits until the machine is idle: less than 2% of its CPU used over each of three
  // 100 ms windows in a row (30 s at most). Tearing down the previous run's containers
  // goes on in the kernel after they are gone (network namespaces are cleaned up by a
  // kernel worker, cgroups after an RCU grace period): without this wait, that work was
  // charged to whichever side ran next, the same side every time.
  static void wait_until_idle() {
    const uint64_t budget_us = 100'000 * 2 * std::thread::hardware_concurrency() / 100;
    int quiet = 0;
    uint64_t t0 = now_monotonic_us();
    for (int i = 0; i < 300 && quiet < 3; ++i) {
      uint64_t cpu0 = machine_cpu_us();
      usleep(100'000);
      quiet = machine_cpu_us() - cpu0 < budget_us ? quiet + 1 : 0;
    }
    if (quiet < 3)
      std::fprintf(stderr, "start_bench: the machine did not become idle in 30 s\n");
    else
      std::fprintf(stderr, "start_bench: %.1f s until the machine was idle\n",
                   ms_since(t0) / 1000.0);
  }

  // Runs `launch` (which returns false on failure) and returns the ms until the task's
  // program wrote to `fifo` (inside the rootfs), or -1.
  double until_running(const std::function<bool()>& launch, const std::string& fifo) {
    std::string host_fifo = dir_ + "/rootfs" + fifo;
    ::unlink(host_fifo.c_str());
    if (mkfifo(host_fifo.c_str(), 0666) < 0) return -1;
    chmod(host_fifo.c_str(), 0666);
    int rd = open(host_fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    uint64_t t0 = now_monotonic_us();
    bool launched = launch();
    pollfd pf{rd, POLLIN, 0};
    double ms = -1;
    while (launched && now_monotonic_us() - t0 < 20'000'000) {
      if (poll(&pf, 1, 100) > 0 && (pf.revents & POLLIN)) {
        ms = ms_since(t0);
        break;
      }
    }
    close(rd);
    ::unlink(host_fifo.c_str());
    return launched ? ms : -1;
  }
  // A CLI that returns once its container is started.
  double until_running(const std::vector<std::string>& cmd, const std::string& fifo) {
    return until_running([&] { return timed_exec(cmd) >= 0; }, fifo);
  }
  // task.run over the agent's socket, as the control plane (or any program) sends it.
  // The agent's own phases (start_phases_us) are added to `phases`.
  double until_running_api(const std::string& name, const std::string& fifo,
                           std::map<std::string, std::vector<double>>* phases) {
    auto c = rpc::Client::connect(sock_);
    if (!c.ok()) return -1;
    json reply;
    double ms = until_running(
        [&] {
          auto r = (*c)->call("task.run", ready_spec(name, fifo));
          if (r.ok()) reply = *r;
          return r.ok();
        },
        fifo);
    if (ms >= 0 && reply.contains("start_phases_us")) {
      for (const auto& [k, v] : reply["start_phases_us"].items())
        (*phases)["agent: " + k].push_back(v.get<double>() / 1000.0);
      double agent_ms = reply["start_latency_us"].get<double>() / 1000.0;
      (*phases)["agent: all (request to weft-init running)"].push_back(agent_ms);
      // The rest: weft-init's mounts, pivot_root, /proc and /dev, credentials,
      // capabilities, seccomp and the exec of the program, and the reply on the socket.
      (*phases)["after: weft-init to the program running, and the reply"].push_back(ms - agent_ms);
    }
    return ms;
  }
  json ready_spec(const std::string& name, const std::string& fifo) {
    return {{"name", name},
            {"argv", {"/bin/start_marker", fifo}},
            {"rootfs", dir_ + "/rootfs"},
            {"namespaces", {{"network", "private"}}}};
  }
  std::vector<std::string> weft_ready_cmd(const std::string& name, const std::string& fifo) {
    return {WEFTCTL_BIN,
            "--agent",
            sock_,
            "task",
            "run",
            "--name",
            name,
            "--rootfs",
            dir_ + "/rootfs",
            "--net",
            "private",
            "--",
            "/bin/start_marker",
            fifo};
  }
  std::vector<std::string> crun_ready_cmd(const std::string& id, const std::string& fifo) {
    std::string b = dir_ + "/bundles/" + id;
    (void)mkdir_p(b);
    json cfg = crun_config_;
    cfg["process"]["args"] = {"/bin/start_marker", fifo};
    (void)write_file(b + "/config.json", cfg.dump());
    return {"crun", "--root", crun_root_, "run", "-d", "--bundle", b, id};
  }
  // One at a time (the sides interleaved), then `conc` at once; each side cleaned up
  // after its own run.
  void ready_side_by_side(int seq, int conc, int bursts) {
    enum Side { kCli, kApi, kCrun };
    const char* names[] = {"weftctl task run", "task.run on the agent's socket", "crun run -d"};
    std::vector<double> one[3], many[3];
    std::map<std::string, std::vector<double>> phases;
    std::vector<std::string> ids;
    auto start = [&](Side side, const std::string& n, const std::string& fifo) {
      if (side == kCli) return until_running(weft_ready_cmd(n, fifo), fifo);
      if (side == kApi) return until_running_api(n, fifo, &phases);
      ids.push_back(n);
      return until_running(crun_ready_cmd(n, fifo), fifo);
    };
    wait_until_idle();
    for (int i = 0; i < seq; ++i)
      for (Side side : {kCli, kApi, kCrun}) {
        double t = start(side, "s" + std::to_string(side) + "-" + std::to_string(i), "/ready");
        if (t < 0) die(std::string(names[side]) + ": the task's program did not run");
        one[side].push_back(t);
      }
    clear_tasks();
    crun_delete_all(ids);
    ids.clear();
    // Each program started and exited at once (weftctl: a usage error, exit 2).
    std::vector<double> own_cli, own_crun;
    for (int i = 0; i < seq; ++i) {
      own_cli.push_back(timed_exec({WEFTCTL_BIN, "--version"}, true, true));
      own_crun.push_back(timed_exec({"crun", "--version"}, true, true));
    }
    // `bursts` rounds of `conc` at once, the sides in turn in each round: one round's
    // figures move a lot on this VM (its p50 through weftctl was 0.46x in one run and
    // 0.23x in the next), the pooled samples much less.
    double cpu_per_start[3] = {0, 0, 0};
    for (int burst = 0; burst < bursts; ++burst)
      for (Side side : {kCli, kApi, kCrun}) {
        std::vector<double> out(static_cast<size_t>(conc));
        wait_until_idle();
        uint64_t cpu0 = machine_cpu_us(), burst0 = now_monotonic_us();
        std::vector<std::string> crun_ids;
        std::vector<std::thread> th;
        std::barrier sync(conc);
        for (int i = 0; i < conc; ++i) {
          std::string n =
              "b" + std::to_string(side) + "-" + std::to_string(burst) + "-" + std::to_string(i);
          if (side == kCrun) crun_ids.push_back(n);
          th.emplace_back([&, i, n] {
            std::string fifo = "/" + n;
            if (side == kCli) {
              auto cmd = weft_ready_cmd(n, fifo);
              sync.arrive_and_wait();
              out[static_cast<size_t>(i)] = until_running(cmd, fifo);
            } else if (side == kApi) {
              auto c = std::move(rpc::Client::connect(sock_)).value();
              json spec = ready_spec(n, fifo);
              sync.arrive_and_wait();
              out[static_cast<size_t>(i)] =
                  until_running([&] { return c->call("task.run", spec).ok(); }, fifo);
            } else {
              auto cmd = crun_ready_cmd(n, fifo);
              sync.arrive_and_wait();
              out[static_cast<size_t>(i)] = until_running(cmd, fifo);
            }
          });
        }
        for (auto& t : th) t.join();
        cpu_per_start[side] +=
            static_cast<double>(machine_cpu_us() - cpu0) / 1000.0 / conc / bursts;
        if (marks_)  // for `perf record -k CLOCK_MONOTONIC` and `perf report --time A,B`
          std::fprintf(stderr, "burst %s: %.6f,%.6f\n", names[side],
                       static_cast<double>(burst0) / 1e6,
                       static_cast<double>(now_monotonic_us()) / 1e6);
        for (double t : out)
          if (t < 0) die(std::string(names[side]) + ": a task's program did not run");
        many[side].insert(many[side].end(), out.begin(), out.end());
        if (side == kCrun)
          crun_delete_all(crun_ids);
        else
          clear_tasks();
      }
    std::printf(
        "\nuntil the task's own program runs (same program, rootfs, user, namespaces, masks, "
        "seccomp; no wrapper):\n");
    Stats s1[3], sn[3];
    for (Side side : {kCli, kApi, kCrun}) {
      s1[side] = stats_of(one[side]);
      sn[side] = stats_of(many[side]);
    }
    for (Side side : {kCli, kApi, kCrun})
      row((std::string(names[side]) + ", 1 at a time").c_str(), s1[side]);
    for (Side side : {kCli, kApi, kCrun})
      row((std::string(names[side]) + ", " + std::to_string(conc) + " at once x " +
           std::to_string(bursts))
              .c_str(),
          sn[side]);
    std::printf(
        "\nwhere the time of task.run goes, 1 at a time (p50; the agent's start_phases_us):\n");
    for (const auto& [name, v] : phases)
      std::printf("  %-58s %7.3f ms\n", name.c_str(), stats_of(v).p50);
    std::printf("  %-58s %7.3f ms\n", "weftctl's own start and exit (weftctl --version)",
                stats_of(own_cli).p50);
    std::printf("  %-58s %7.3f ms\n", "crun's own start and exit (crun --version)",
                stats_of(own_crun).p50);
    std::printf(
        "\nthe machine's CPU time during the %d-at-once runs, per start (every process: the "
        "CLI, the agent, weft-init or crun, the benchmark's own fork and wait):\n",
        conc);
    for (Side side : {kCli, kApi, kCrun})
      std::printf("  %-58s %7.3f ms\n", names[side], cpu_per_start[side]);
    std::printf("\n");
    for (Side side : {kCli, kApi}) {
      std::printf("  %s / crun, 1 at a time:  p50 %.2fx  p90 %.2fx  p99 %.2fx\n", names[side],
                  s1[side].p50 / s1[kCrun].p50, s1[side].p90 / s1[kCrun].p90,
                  s1[side].p99 / s1[kCrun].p99);
      std::printf("  %s / crun, %d at once:  p50 %.2fx  p90 %.2fx  p99 %.2fx\n", names[side], conc,
                  sn[side].p50 / sn[kCrun].p50, sn[side].p90 / sn[kCrun].p90,
                  sn[side].p99 / sn[kCrun].p99);
    }
  }
  // ---- a short task's whole life ----
  // From the command to the moment the client knows the task exited (and its state is
  // gone): `weftctl task run --wait --rm`, task.run + task.wait with "remove" on the
  // agent's socket, and `crun run` in the foreground (it creates, starts, waits and
  // deletes). The same /bin/true in the same rootfs, user, namespaces, masks and seccomp.
  std::vector<std::string> weft_life_cmd(const std::string& name) {
    return {WEFTCTL_BIN,      "--agent", sock_,     "task", "run",
            "--wait",         "--rm",    "--name",  name,   "--rootfs",
            dir_ + "/rootfs", "--net",   "private", "--",   "/bin/true"};
  }
  std::vector<std::string> crun_life_cmd(const std::string& id) {
    std::string b = dir_ + "/bundles/" + id;
    (void)mkdir_p(b);
    json cfg = crun_config_;
    cfg["process"]["args"] = {"/bin/true"};
    (void)write_file(b + "/config.json", cfg.dump());
    return {"crun", "--root", crun_root_, "run", "--bundle", b, id};
  }
  double life_api(rpc::Client& c, const std::string& name) {
    uint64_t t0 = now_monotonic_us();
    json spec = {{"name", name},
                 {"argv", {"/bin/true"}},
                 {"rootfs", dir_ + "/rootfs"},
                 {"namespaces", {{"network", "private"}}}};
    auto r = c.call("task.run", spec);
    if (!r.ok()) return -1;
    std::string id = (*r)["id"];
    json w;
    do {
      auto got = c.call("task.wait", {{"id", id}, {"wait_ms", 20000}, {"remove", true}}, 30000);
      if (!got.ok()) return -1;
      w = *got;
    } while (!w.value("ended", false));
    if (w.value("exit_code", -1) != 0 || !w.value("removed", false)) return -1;
    return ms_since(t0);
  }
  void life_side_by_side(int seq, int conc, int bursts) {
    enum Side { kCli, kApi, kCrun };
    const char* names[] = {"weftctl task run --wait --rm", "task.run + task.wait (remove)",
                           "crun run (foreground)"};
    std::vector<double> one[3], many[3];
    auto once = [&](Side side, const std::string& n, rpc::Client* c) -> double {
      if (side == kApi) return life_api(*c, n);
      double ms = timed_exec(side == kCli ? weft_life_cmd(n) : crun_life_cmd(n));
      if (side == kCrun) (void)remove_tree(dir_ + "/bundles/" + n);
      return ms;
    };
    wait_until_idle();
    auto api = std::move(rpc::Client::connect(sock_)).value();
    for (int i = 0; i < seq; ++i)
      for (Side side : {kCli, kApi, kCrun}) {
        double t = once(side, "l" + std::to_string(side) + "-" + std::to_string(i), api.get());
        if (t < 0) die(std::string(names[side]) + ": the task did not run to its end");
        one[side].push_back(t);
      }
    for (int burst = 0; burst < bursts; ++burst)
      for (Side side : {kCli, kApi, kCrun}) {
        std::vector<double> out(static_cast<size_t>(conc));
        wait_until_idle();
        uint64_t burst0 = now_monotonic_us();
        std::vector<std::thread> th;
        std::barrier sync(conc);
        for (int i = 0; i < conc; ++i) {
          std::string n =
              "m" + std::to_string(side) + "-" + std::to_string(burst) + "-" + std::to_string(i);
          th.emplace_back([&, i, n] {
            std::unique_ptr<rpc::Client> c;
            if (side == kApi) c = std::move(rpc::Client::connect(sock_)).value();
            sync.arrive_and_wait();
            out[static_cast<size_t>(i)] = once(side, n, c.get());
          });
        }
        for (auto& t : th) t.join();
        if (marks_)
          std::fprintf(stderr, "life burst %s: %.6f,%.6f\n", names[side],
                       static_cast<double>(burst0) / 1e6,
                       static_cast<double>(now_monotonic_us()) / 1e6);
        for (double t : out)
          if (t < 0) die(std::string(names[side]) + ": a task did not run to its end");
        many[side].insert(many[side].end(), out.begin(), out.end());
      }
    std::printf(
        "\na short task's whole life, /bin/true: from the command until the client knows it "
        "exited and its state is gone (same rootfs, user, namespaces, masks, seccomp):\n");
    Stats s1[3], sn[3];
    for (Side side : {kCli, kApi, kCrun}) {
      s1[side] = stats_of(one[side]);
      sn[side] = stats_of(many[side]);
    }
    for (Side side : {kCli, kApi, kCrun})
      row((std::string(names[side]) + ", 1 at a time").c_str(), s1[side]);
    for (Side side : {kCli, kApi, kCrun})
      row((std::string(names[side]) + ", " + std::to_string(conc) + " at once x " +
           std::to_string(bursts))
              .c_str(),
          sn[side]);
    std::printf("\n");
    for (Side side : {kCli, kApi}) {
      std::printf("  %s / crun, 1 at a time:  p50 %.2fx  p90 %.2fx  p99 %.2fx\n", names[side],
                  s1[side].p50 / s1[kCrun].p50, s1[side].p90 / s1[kCrun].p90,
                  s1[side].p99 / s1[kCrun].p99);
      std::printf("  %s / crun, %d at once:  p50 %.2fx  p90 %.2fx  p99 %.2fx\n", names[side], conc,
                  sn[side].p50 / sn[kCrun].p50, sn[side].p90 / sn[kCrun].p90,
                  sn[side].p99 / sn[kCrun].p99);
    }
  }
  std::vector<std::string> crun_cmd(const std::vector<std::string>& args) {
    std::vector<std::string> a = {"crun", "--root", crun_root_};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  void crun_delete_all(const std::vector<std::string>& ids) {
    for (const auto& id : ids) timed_exec(crun_cmd({"delete", "-f", id}));
  }

  pid_t agent() const { return agent_; }
  bool marks_ = false;
  std::string sock_, dir_, cg_root_, crun_root_;
  json crun_config_;

 private:
  pid_t agent_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-agent start latency and footprint, side by side with crun"};
  int seq = 200, conc = 100, rounds = 5, resident = 1000, idle_s = 10, bursts = 3;
  bool no_crun = false;
  app.add_option("--seq", seq, "sequential starts");
  app.add_option("--conc", conc, "concurrent clients");
  app.add_option("--rounds", rounds, "concurrent rounds");
  app.add_option("--bursts", bursts,
                 "rounds of --conc at once in the comparison with crun, the sides in turn")
      ->check(CLI::Range(1, 50));
  app.add_option("--resident", resident, "resident tasks for the footprint phase");
  app.add_option("--idle-seconds", idle_s, "idle CPU measurement window");
  app.add_flag("--no-crun", no_crun, "skip the crun comparison");
  bool ready_only = false, life_only = false;
  app.add_flag("--ready-only", ready_only,
               "only the like-for-like comparison until the task's program runs");
  app.add_flag("--life-only", life_only,
               "only the like-for-like comparison of a short task's whole life (/bin/true, "
               "from the command until the client knows it exited)");
  int netns_pool = -1;
  app.add_option("--netns-pool", netns_pool,
                 "the agent's netns_pool (network namespaces made ahead; default: agent.toml's)")
      ->check(CLI::Range(0, 64));
  int sandbox_pool = -1;
  app.add_option("--sandbox-pool", sandbox_pool,
                 "the agent's sandbox_pool (sandboxes made ahead; default: agent.toml's)")
      ->check(CLI::Range(0, 64));
  bool marks = false;
  app.add_flag("--marks", marks,
               "print each at-once run's window (CLOCK_MONOTONIC seconds) on stderr, to slice "
               "a `perf record -a -k CLOCK_MONOTONIC` profile by side");
  CLI11_PARSE(app, argc, argv);
  if (geteuid() != 0) Bench::die("needs root");
  own_cgroup2_view();

  Bench b;
  b.marks_ = marks;
  b.start_agent(netns_pool, sandbox_pool);
  if (ready_only || life_only) {
    b.crun_setup();
    if (ready_only) b.ready_side_by_side(seq, conc, bursts);
    if (life_only) b.life_side_by_side(seq, conc, bursts);
    return 0;
  }
  std::printf("weft start_bench: %d sequential, %d concurrent x %d rounds, %d resident\n", seq,
              conc, rounds, resident);
  std::printf("machine: %ld CPUs, kernel ", sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);
  (void)system("uname -r");

  std::vector<double> a1, c1, a100, c100;
  b.weft_sequential(seq, &a1, &c1);
  b.weft_concurrent(conc, rounds, &a100, &c100);
  std::printf("\nweft-agent start latency (rootfs + pid/mount/uts/ipc/net namespaces + cgroup):\n");
  row("agent-side, 1 at a time", stats_of(a1));
  row(("agent-side, " + std::to_string(conc) + " concurrent clients").c_str(), stats_of(a100));
  row("client round trip, 1 at a time", stats_of(c1));
  row(("client round trip, " + std::to_string(conc) + " concurrent (incl. queueing)").c_str(),
      stats_of(c100));

  if (!no_crun) {
    b.crun_setup();
    b.ready_side_by_side(seq, conc, bursts);
    b.life_side_by_side(seq, conc, bursts);
  }

  // Footprint with many resident tasks.
  {
    auto c = std::move(rpc::Client::connect(b.sock_)).value();
    std::vector<pid_t> inits;
    for (int i = 0; i < resident; ++i) {
      auto r = c->call("task.run", b.spec("res-" + std::to_string(i), false));
      if (!r.ok()) Bench::die("resident task.run: " + r.error().str());
      inits.push_back((*r)["pid"].get<pid_t>());
    }
    sleep(2);
    uint64_t rss = status_kb(b.agent(), "VmRSS:");
    long hz = sysconf(_SC_CLK_TCK);
    uint64_t t0 = cpu_ticks(b.agent());
    uint64_t w0 = now_monotonic_us();
    sleep(static_cast<unsigned>(idle_s));
    double cpu_s = static_cast<double>(cpu_ticks(b.agent()) - t0) / static_cast<double>(hz);
    double wall_s = static_cast<double>(now_monotonic_us() - w0) / 1e6;
    std::vector<double> irss, ipss;
    for (pid_t p : inits) {
      irss.push_back(static_cast<double>(status_kb(p, "VmRSS:")));
      ipss.push_back(static_cast<double>(pss_kb(p)));
    }
    Stats ir = stats_of(irss), ip = stats_of(ipss);
    std::printf("\nwith %d resident tasks:\n", resident);
    std::printf("  agent RSS:                 %.1f MiB\n", static_cast<double>(rss) / 1024.0);
    std::printf("  agent idle CPU:            %.3f%% of a core over %.0f s\n",
                100.0 * cpu_s / wall_s, wall_s);
    std::printf("  weft-init RSS per task:    mean %.0f KiB, max %.0f KiB (PSS mean %.0f KiB)\n",
                ir.mean, ir.max, ip.mean);
    b.clear_tasks();
  }
  return 0;
}
