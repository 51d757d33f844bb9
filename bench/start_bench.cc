// Start-latency and footprint benchmark for weft-agent, side by side with crun.
//
//   sudo build/bench/start_bench [--seq N] [--conc N] [--rounds N] [--resident N]
//                                [--idle-seconds S] [--no-crun]
//
// Prints, for one run on this machine:
//  - agent-side start latency (task.run accepted -> weft-init running in the task's
//    cgroup), p50/p99, sequential and N concurrent clients; plus what the clients saw;
//  - wall time of the CLI that starts a container: `weftctl task run` vs `crun run -d`
//    of an equivalent minimal container (busybox rootfs, pid/mount/uts/ipc/net
//    namespaces, one cgroup each), sequential and N at once, with ratios;
//  - like for like, until the task's own program runs (it writes to a fifo the
//    benchmark waits on): `weftctl task run` vs `crun run -d`, each through the same
//    mount-namespace wrapper, the same static program in the same rootfs, the same
//    namespaces, user (nobody), masked/read-only paths and seccomp deny list;
//  - with R resident tasks: agent RSS, agent CPU while idle, per-task weft-init RSS/PSS.
// Needs root. Cleans up every task, cgroup and file it makes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "agent/init/confine.h"
#include "bench/bench_util.h"
#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc.h"

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
    if (system(("cp " START_MARKER_BIN " " + dir_ + "/rootfs/bin/start_marker").c_str()) != 0)
      die("cannot copy start_marker");
    cg_root_ =
        HostPaths().cgroup2_mount().value_or("/sys/fs/cgroup") + "/weft-bench-" + random_hex(4);
    sock_ = dir_ + "/agent.sock";
    (void)write_file(dir_ + "/agent.toml", "socket = \"" + sock_ + "\"\nstate_dir = \"" + dir_ +
                                               "/state\"\ncgroup_root = \"" + cg_root_ +
                                               "\"\ninit_path = \"" + WEFT_INIT_BIN + "\"\n");
  }
  ~Bench() {
    kill_process(agent_);
    remove_cgroup_tree(cg_root_);
    (void)remove_tree(dir_);
  }
  [[noreturn]] static void die(const std::string& m) {
    std::fprintf(stderr, "start_bench: %s\n", m.c_str());
    std::exit(1);
  }

  void start_agent() {
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

  std::vector<std::string> weftctl_run(const std::string& name) {
    return {WEFTCTL_BIN, "--agent",        sock_,   "task",    "run", "--name",     name,
            "--rootfs",  dir_ + "/rootfs", "--net", "private", "--",  "/bin/sleep", "100000"};
  }

  void cli_sequential_weft(int n, std::vector<double>* ms) {
    for (int i = 0; i < n; ++i) {
      double t = timed_exec(weftctl_run("cli-" + std::to_string(i)));
      if (t < 0) die("weftctl task run failed");
      ms->push_back(t);
    }
    clear_tasks();
  }

  // Runs all argvs at once; returns each one's wall time.
  static std::vector<double> burst(const std::vector<std::vector<std::string>>& cmds) {
    std::vector<double> out(cmds.size());
    std::vector<std::thread> th;
    std::barrier sync(static_cast<ptrdiff_t>(cmds.size()));
    for (size_t i = 0; i < cmds.size(); ++i)
      th.emplace_back([&, i] {
        sync.arrive_and_wait();
        out[i] = timed_exec(cmds[i]);
      });
    for (auto& t : th) t.join();
    return out;
  }

  // crun, through a wrapper that gives it a private mount namespace whose
  // /sys/fs/cgroup is the cgroup2 tree (crun refuses this machine's hybrid layout).
  void crun_setup() {
    (void)write_file(dir_ + "/crun-ns.sh",
                     "#!/bin/sh\nmount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup "
                     "&& exec \"$@\"\n");
    chmod((dir_ + "/crun-ns.sh").c_str(), 0755);
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

  // Starts `cmd` (a CLI that returns once its container is started) and returns the ms
  // until the task's program wrote to `fifo` (inside the rootfs), or -1.
  double until_running(const std::vector<std::string>& cmd, const std::string& fifo) {
    std::string host_fifo = dir_ + "/rootfs" + fifo;
    ::unlink(host_fifo.c_str());
    if (mkfifo(host_fifo.c_str(), 0666) < 0) return -1;
    chmod(host_fifo.c_str(), 0666);
    int rd = open(host_fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    std::vector<char*> a;
    for (const auto& x : cmd) a.push_back(const_cast<char*>(x.c_str()));
    a.push_back(nullptr);
    uint64_t t0 = now_monotonic_us();
    pid_t p = fork();
    if (p == 0) {
      int fd = open("/dev/null", O_WRONLY);
      dup2(fd, 1);
      execvp(a[0], a.data());
      _exit(127);
    }
    pollfd pf{rd, POLLIN, 0};
    double ms = -1;
    while (now_monotonic_us() - t0 < 20'000'000) {
      if (poll(&pf, 1, 100) > 0 && (pf.revents & POLLIN)) {
        ms = ms_since(t0);
        break;
      }
    }
    int status = 0;
    waitpid(p, &status, 0);
    close(rd);
    ::unlink(host_fifo.c_str());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    return ms;
  }
  std::vector<std::string> wrapped(std::vector<std::string> cmd) {
    cmd.insert(cmd.begin(), {"unshare", "-m", dir_ + "/crun-ns.sh"});
    return cmd;
  }
  std::vector<std::string> weft_ready_cmd(const std::string& name, const std::string& fifo) {
    return wrapped({WEFTCTL_BIN, "--agent", sock_, "task", "run", "--name", name, "--rootfs",
                    dir_ + "/rootfs", "--net", "private", "--", "/bin/start_marker", fifo});
  }
  std::vector<std::string> crun_ready_cmd(const std::string& id, const std::string& fifo) {
    std::string b = dir_ + "/bundles/" + id;
    (void)mkdir_p(b);
    json cfg = crun_config_;
    cfg["process"]["args"] = {"/bin/start_marker", fifo};
    (void)write_file(b + "/config.json", cfg.dump());
    return wrapped({"crun", "--root", dir_ + "/crun-state", "run", "-d", "--bundle", b, id});
  }
  // One at a time, then `conc` at once; each side cleaned up after its own run.
  void ready_side_by_side(int seq, int conc) {
    std::vector<double> wseq, cseq, wb, cb;
    std::vector<std::string> ids;
    for (int i = 0; i < seq; ++i) {
      double t = until_running(weft_ready_cmd("ready-" + std::to_string(i), "/ready"), "/ready");
      if (t < 0) die("weft: the task's program did not run");
      wseq.push_back(t);
      std::string id = "rdy-" + std::to_string(i);
      double c = until_running(crun_ready_cmd(id, "/ready"), "/ready");
      if (c < 0) die("crun: the task's program did not run");
      cseq.push_back(c);
      ids.push_back(id);
    }
    clear_tasks();
    crun_delete_all(ids);
    ids.clear();
    auto burst_of = [&](bool weft) {
      std::vector<double> out(static_cast<size_t>(conc));
      std::vector<std::thread> th;
      std::barrier sync(conc);
      for (int i = 0; i < conc; ++i)
        th.emplace_back([&, i] {
          std::string n = (weft ? "wb-" : "cb-") + std::to_string(i), fifo = "/" + n;
          auto cmd = weft ? weft_ready_cmd(n, fifo) : crun_ready_cmd(n, fifo);
          sync.arrive_and_wait();
          out[static_cast<size_t>(i)] = until_running(cmd, fifo);
        });
      for (auto& t : th) t.join();
      for (int i = 0; i < conc && !weft; ++i) ids.push_back("cb-" + std::to_string(i));
      for (double t : out)
        if (t < 0) die(std::string(weft ? "weft" : "crun") + ": a task's program did not run");
      return out;
    };
    wb = burst_of(true);
    clear_tasks();
    cb = burst_of(false);
    crun_delete_all(ids);
    Stats ws = stats_of(wseq), cs = stats_of(cseq), wbs = stats_of(wb), cbs = stats_of(cb);
    std::printf(
        "\nuntil the task's own program runs (same wrapper, program, rootfs, user, "
        "namespaces, masks, seccomp):\n");
    row("weftctl task run, 1 at a time", ws);
    row("crun run -d, 1 at a time", cs);
    row(("weftctl task run, " + std::to_string(conc) + " at once").c_str(), wbs);
    row(("crun run -d, " + std::to_string(conc) + " at once").c_str(), cbs);
    std::printf("  weft/crun, 1 at a time:   p50 %.2fx  p99 %.2fx\n", ws.p50 / cs.p50,
                ws.p99 / cs.p99);
    std::printf("  weft/crun, %d at once:   p50 %.2fx  p99 %.2fx\n", conc, wbs.p50 / cbs.p50,
                wbs.p99 / cbs.p99);
  }
  std::vector<std::string> crun_cmd(const std::vector<std::string>& args) {
    std::vector<std::string> a = {"unshare", "-m",     dir_ + "/crun-ns.sh",
                                  "crun",    "--root", dir_ + "/crun-state"};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  std::vector<std::string> crun_run(const std::string& id) {
    return crun_cmd({"run", "-d", "--bundle", dir_ + "/bundle", id});
  }
  void crun_delete_all(const std::vector<std::string>& ids) {
    for (const auto& id : ids) timed_exec(crun_cmd({"delete", "-f", id}));
  }

  pid_t agent() const { return agent_; }
  std::string sock_, dir_, cg_root_;
  json crun_config_;

 private:
  pid_t agent_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-agent start latency and footprint, side by side with crun"};
  int seq = 200, conc = 100, rounds = 5, resident = 1000, idle_s = 10;
  bool no_crun = false;
  app.add_option("--seq", seq, "sequential starts");
  app.add_option("--conc", conc, "concurrent clients");
  app.add_option("--rounds", rounds, "concurrent rounds");
  app.add_option("--resident", resident, "resident tasks for the footprint phase");
  app.add_option("--idle-seconds", idle_s, "idle CPU measurement window");
  app.add_flag("--no-crun", no_crun, "skip the crun comparison");
  bool ready_only = false;
  app.add_flag("--ready-only", ready_only,
               "only the like-for-like comparison until the task's program runs");
  CLI11_PARSE(app, argc, argv);
  if (geteuid() != 0) Bench::die("needs root");

  Bench b;
  b.start_agent();
  if (ready_only) {
    b.crun_setup();
    b.ready_side_by_side(std::min(seq, 50), conc);
    return 0;
  }
  std::printf("weft start_bench: %d sequential, %d concurrent x %d rounds, %d resident\n", seq,
              conc, rounds, resident);
  std::printf("machine: %ld CPUs, kernel ", sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);
  (void)system("uname -r");

  std::vector<double> a1, c1, a100, c100, cli_seq;
  b.weft_sequential(seq, &a1, &c1);
  b.weft_concurrent(conc, rounds, &a100, &c100);
  b.cli_sequential_weft(std::min(seq, 100), &cli_seq);
  std::vector<std::vector<std::string>> wburst;
  for (int i = 0; i < conc; ++i) wburst.push_back(b.weftctl_run("burst-" + std::to_string(i)));
  auto cli_burst = Bench::burst(wburst);
  b.clear_tasks();

  std::printf("\nweft-agent start latency (rootfs + pid/mount/uts/ipc/net namespaces + cgroup):\n");
  row("agent-side, 1 at a time", stats_of(a1));
  row(("agent-side, " + std::to_string(conc) + " concurrent clients").c_str(), stats_of(a100));
  row("client round trip, 1 at a time", stats_of(c1));
  row(("client round trip, " + std::to_string(conc) + " concurrent (incl. queueing)").c_str(),
      stats_of(c100));

  Stats weft_cli = stats_of(cli_seq), weft_cli_b = stats_of(cli_burst);
  if (!no_crun) {
    b.crun_setup();
    std::vector<double> crun_seq, wrap;
    std::vector<std::string> ids;
    for (int i = 0; i < std::min(seq, 100); ++i) {
      std::string id = "wb-" + std::to_string(i);
      double t = timed_exec(b.crun_run(id));
      if (t < 0) Bench::die("crun run failed");
      crun_seq.push_back(t);
      ids.push_back(id);
      wrap.push_back(timed_exec({"unshare", "-m", b.dir_ + "/crun-ns.sh", "true"}));
    }
    b.crun_delete_all(ids);
    ids.clear();
    std::vector<std::vector<std::string>> cburst;
    for (int i = 0; i < conc; ++i) {
      ids.push_back("wbb-" + std::to_string(i));
      cburst.push_back(b.crun_run(ids.back()));
    }
    auto crun_burst = Bench::burst(cburst);
    b.crun_delete_all(ids);
    for (double t : crun_burst)
      if (t < 0) Bench::die("a concurrent crun run failed");
    Stats cs = stats_of(crun_seq), cb = stats_of(crun_burst), w = stats_of(wrap);
    std::printf(
        "\nCLI wall time to a running container (same rootfs and namespaces, one cgroup each):\n");
    row("weftctl task run, 1 at a time", weft_cli);
    row("crun run -d, 1 at a time", cs);
    row("  (of which the crun mount-namespace wrapper)", w);
    row(("weftctl task run, " + std::to_string(conc) + " at once").c_str(), weft_cli_b);
    row(("crun run -d, " + std::to_string(conc) + " at once").c_str(), cb);
    std::printf("  ratio crun/weft p50, 1 at a time:      %.1fx (%.1fx without the wrapper)\n",
                cs.p50 / weft_cli.p50, (cs.p50 - w.p50) / weft_cli.p50);
    std::printf("  ratio crun/weft p50, %d at once:      %.1fx\n", conc, cb.p50 / weft_cli_b.p50);
    std::printf("  ratio crun/weft p99, %d at once:      %.1fx\n", conc, cb.p99 / weft_cli_b.p99);
    b.ready_side_by_side(std::min(seq, 50), conc);
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
