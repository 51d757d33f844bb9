#include "tests/cluster_harness.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "testing/process.h"
#include "tests/agent_harness.h"

namespace weft::testing {

namespace {
constexpr const char* kHubAddr = "10.77.0.1";
constexpr int kCpPort = 7070;
constexpr const char* kFaketimeLib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

bool sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  if (rc != 0) ADD_FAILURE() << "command failed (" << rc << "): " << cmd;
  return rc == 0;
}
}  // namespace

namespace {
// Every mount at or below `dir` (state_fs_size's tmpfs), detached, deepest first.
void unmount_under(const std::string& dir) {
  auto table = read_file("/proc/self/mounts");
  if (!table.ok()) return;
  std::vector<std::string> points;
  size_t at = 0;
  while (at < table->size()) {
    size_t eol = table->find('\n', at);
    std::string line = table->substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    at = eol == std::string::npos ? table->size() : eol + 1;
    size_t a = line.find(' ');
    size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
    if (b == std::string::npos) continue;
    std::string point = line.substr(a + 1, b - a - 1);
    if (point == dir || point.rfind(dir + "/", 0) == 0) points.push_back(point);
  }
  std::sort(points.begin(), points.end(), std::greater<>());
  for (const auto& p : points) (void)::umount2(p.c_str(), MNT_DETACH);
}

// A tmpfs of `size` at `dir` (made if missing).
bool mount_small(const std::string& dir, const std::string& size) {
  if (!mkdir_p(dir).ok()) return false;
  std::string data = "size=" + size + ",mode=0755";
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, data.c_str()) != 0) {
    ADD_FAILURE() << "cannot mount a tmpfs at " << dir << ": " << std::strerror(errno);
    return false;
  }
  return true;
}
}  // namespace

ClusterHarness::ClusterHarness(ClusterOptions opts) : opts_(opts) {
  id_ = random_hex(3);
  dir_ = std::filesystem::temp_directory_path() / ("weft-e2e-" + id_);
  hub_ = "weft-" + id_ + "-hub";
  auto mount = HostPaths().cgroup2_mount();
  mount_ = mount.value_or("/sys/fs/cgroup");
  cgroup_parent_ = mount_ + "/weft-e2e-" + id_;
}

// A harness whose process died without its destructor (a sanitizer abort, SIGKILL)
// leaves namespaces, cgroups and files; the next harness removes them. Its daemons died
// with it (PR_SET_PDEATHSIG); tasks in its cgroups are killed here.
// libfaketime makes a semaphore and a shared memory object per process (/dev/shm/
// sem.faketime_sem_<pid>, faketime_shm_<pid>) and removes them at a clean exit only: a
// daemon or task SIGKILLed under it leaves them. Those of processes that are gone go.
void ClusterHarness::sweep_faketime_shm() {
  auto entries = list_dir("/dev/shm");
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    std::string pid;
    for (const char* prefix : {"faketime_shm_", "sem.faketime_sem_"})
      if (e.rfind(prefix, 0) == 0) pid = e.substr(std::string(prefix).size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!process_alive(static_cast<pid_t>(std::atoi(pid.c_str()))))
      (void)::unlink(("/dev/shm/" + e).c_str());
  }
}

void ClusterHarness::sweep_stale() {
  auto tmp = std::filesystem::temp_directory_path().string();
  auto entries = list_dir(tmp);
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    if (e.rfind("weft-e2e-", 0) != 0) continue;
    std::string dir = tmp + "/" + e;
    auto owner = read_file(dir + "/owner");
    // Alive: another harness's, leave it.
    if (owner.ok() && process_alive(static_cast<pid_t>(std::atoi(owner->c_str())))) continue;
    std::string id = e.substr(9);
    auto ns = list_dir("/run/netns");
    if (ns.ok())
      for (const auto& n : *ns)
        if (n.rfind("weft-" + id + "-", 0) == 0)
          (void)std::system(("ip netns del " + n + " >/dev/null 2>&1").c_str());
    destroy_cgroup_tree(mount_ + "/weft-e2e-" + id);
    // (The cgroup2 root's controllers: its SubtreeControlLease counts no more.)
    unmount_under(dir);
    (void)remove_tree(dir);
  }
}

bool ClusterHarness::setup() {
  sweep_stale();
  lease_ = std::make_unique<SubtreeControlLease>(mount_);
  // The owner first: a sweep by another harness must never take a directory being made.
  if (!mkdir_p(dir_).ok() || !write_file(dir_ + "/owner", std::to_string(::getpid())).ok() ||
      !mkdir_p(dir_ + "/profiles").ok()) {
    ADD_FAILURE() << "cannot create " << dir_;
    return false;
  }
  if (opts_.faked_wall_clocks) {
    if (::access(kFaketimeLib, R_OK) != 0) {
      ADD_FAILURE() << kFaketimeLib << " is missing (scripts/setup.sh --test installs libfaketime)";
      return false;
    }
    if (!write_file(dir_ + "/clock-cp", "+0\n").ok()) return false;
  }
  if (!mount_state_fs(cp_state_dir(), dir_ + "/disk-delay-cp")) return false;
  // Two host profiles confined to each machine's own cgroup subtree.
  auto dev = read_file(WEFT_SOURCE_DIR "/examples/dev.toml");
  if (!dev.ok() || !write_file(dir_ + "/profiles/dev.toml", *dev).ok() ||
      !write_file(dir_ + "/profiles/web.toml",
                  "description = \"e2e: a second profile\"\n[cgroup]\nenable = [\"hugetlb\"]\n")
           .ok()) {
    ADD_FAILURE() << "cannot write the profiles";
    return false;
  }
  if (!mkdir_p(cgroup_parent_).ok()) {
    ADD_FAILURE() << "cannot create " << cgroup_parent_;
    return false;
  }
  cgroup_made_ = true;
  netns_made_.push_back(hub_);
  if (!sh("ip netns add " + hub_) || !sh("ip -n " + hub_ + " link set lo up") ||
      !sh("ip -n " + hub_ + " link add br0 type bridge") ||
      !sh("ip -n " + hub_ + " addr add " + kHubAddr + "/24 dev br0") ||
      !sh("ip -n " + hub_ + " link set br0 up"))
    return false;
  // Mutual TLS on every machine session: a CA for this cluster, the control plane's
  // certificate for its address, one certificate per machine naming its id.
  std::string pki = dir_ + "/pki";
  if (opts_.tls) {
    std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
    std::string cmds = tool + " ca " + pki + " && " + tool + " issue " + pki +
                       " controlplane --dns controlplane --ip " + kHubAddr;
    for (int i = 0; i < opts_.machines; ++i)
      cmds += " && " + tool + " issue " + pki + " " + machine_id(i) + " --ou machine";
    if (!sh("(" + cmds + ") >/dev/null")) return false;
  }
  for (int i = 0; i < opts_.machines; ++i) {
    Machine m;
    m.dir = dir_ + "/m" + std::to_string(i);
    m.netns = "weft-" + id_ + "-m" + std::to_string(i);
    m.cgroup_root = cgroup_parent_ + "/m" + std::to_string(i);
    machines_.push_back(m);
    netns_made_.push_back(m.netns);
    std::string peer = "w" + id_ + "p" + std::to_string(i);  // the bridge side
    std::string addr = machine_address(i) + "/24";
    if (!mount_state_fs(m.dir + "/agent", m.dir + "/disk-delay")) return false;
    if (!mkdir_p(m.dir).ok() ||
        (opts_.faked_wall_clocks && !write_file(m.dir + "/clock", "+0\n").ok()) ||
        !sh("ip netns add " + m.netns) || !sh("ip -n " + m.netns + " link set lo up") ||
        !sh("ip -n " + m.netns + " link add eth0 type veth peer name " + peer + " netns " + hub_) ||
        !sh("ip -n " + m.netns + " addr add " + addr + " dev eth0") ||
        !sh("ip -n " + m.netns + " link set eth0 up") ||
        !sh("ip -n " + hub_ + " link set " + peer + " master br0 up"))
      return false;
    // Its own copy of the profiles when it lacks one (ClusterOptions::lacks_profile).
    std::string profiles = dir_ + "/profiles";
    if (auto lack = opts_.lacks_profile.find(i); lack != opts_.lacks_profile.end()) {
      profiles = dir_ + "/profiles-" + machine_id(i);
      if (!mkdir_p(profiles).ok()) return false;
      for (const char* p : {"dev", "web"})
        if (lack->second != p &&
            !write_file(profiles + "/" + p + ".toml",
                        read_file(dir_ + "/profiles/" + p + ".toml").value_or(""))
                 .ok())
          return false;
    }
    std::string cp = std::string(kHubAddr) + ":" + std::to_string(kCpPort);
    std::string common = "machine_id = \"" + machine_id(i) + "\"\ncontrol_plane = \"" + cp + "\"\n";
    if (opts_.tls)
      common += "control_plane_tls_ca = \"" + pki + "/ca.pem\"\ncontrol_plane_tls_cert = \"" + pki +
                "/" + machine_id(i) + ".pem\"\ncontrol_plane_tls_key = \"" + pki + "/" +
                machine_id(i) + ".key\"\ncontrol_plane_tls_crl = \"" + pki + "/crl.pem\"\n";
    else
      common += "insecure_control_plane = true\n";
    bool ok =
        write_file(m.dir + "/agent.toml", common + "socket = \"" + m.dir +
                                              "/agent.sock\"\nstate_dir = \"" + m.dir +
                                              "/agent\"\ncgroup_root = \"" + m.cgroup_root +
                                              "\"\ninit_path = \"" WEFT_INIT_BIN
                                              "\"\nlog_level = \"debug\"\n"
                                              "allow_root_tasks = true\ndefault_task_user = \"\"\n"
                                              "dns_listen = \"127.0.0.1:8600\"\n"
                                              "usage_interval = \"1s\"\n"
                                              "[labels]\ndc = \"e2e\"\nrack = \"rack" +
                                              std::to_string(i) +
                                              "\"\n"
                                              // Each machine's own bridge, in its namespace.
                                              "[bridge]\nsubnet = \"10.89.0.0/24\"\n"
                                              "host_ports = [18083]\n")
            .ok() &&
        write_file(m.dir + "/sidekick.toml",
                   common + "socket = \"" + m.dir + "/sidekick.sock\"\nstate_dir = \"" + m.dir +
                       "/sidekick\"\nprofile_dirs = [\"" + profiles + "\"]\nworkload_cgroup = \"" +
                       m.cgroup_root + "/tasks\"\napply_on_start = false\n")
            .ok() &&
        // Only what is this machine's own: no kernel log or BPF (shared by every
        // "machine" of this host), no CPU pressure and other PSI failing only at
        // 100% (the host is shared too, and its CPUs are busy with builds and other tests).
        write_file(m.dir + "/hcs.toml",
                   common + "socket = \"" + m.dir + "/hcs.sock\"\nstate_dir = \"" + m.dir +
                       "/hcs\"\ninterval = \"" + opts_.hcs_interval +
                       "\"\nkmsg = false\npsi_triggers = false\npsi = [\"memory\", \"io\"]\n"
                       "psi_degraded_pct = 90\n"
                       "psi_failed_pct = 100\n[kernel]\nbpf = false\n[liveness]\n"
                       "agent_socket = \"" +
                       m.dir + "/agent.sock\"\nsidekick_socket = \"" + m.dir + "/sidekick.sock\"\n")
            .ok();
    if (!ok) {
      ADD_FAILURE() << "cannot write machine " << i << "'s configuration";
      return false;
    }
  }
  // A key for jobs' secrets at rest, as the packages make one.
  if (!write_file_atomic(dir_ + "/secrets.key", "k1 " + std::string(64, 'd') + "\n", 0600).ok())
    return false;
  cp_conf_ =
      "socket = \"" + dir_ + "/cp.sock\"\nstate_dir = \"" + dir_ + "/cp\"\nlisten = \"" + kHubAddr +
      ":" + std::to_string(kCpPort) + "\"\nsecrets_key = \"" + dir_ + "/secrets.key\"\n" +
      (opts_.tls ? "tls_ca = \"" + pki + "/ca.pem\"\ntls_cert = \"" + pki +
                       "/controlplane.pem\"\ntls_key = \"" + pki +
                       "/controlplane.key\"\ntls_crl = \"" + pki + "/crl.pem\"\n"
                 : std::string("insecure_listen = true\n")) +
      "heartbeat_interval = \"" + opts_.heartbeat +
      "\"\nmissed_heartbeats = " + std::to_string(opts_.missed_heartbeats) +
      "\ndestructive_per_min = 600\ndestructive_burst = 50\n"
      // Autoscaling decides every second (it touches only jobs that autoscale).
      "autoscale_interval = \"1s\"\n"
      // The ReBalancer moves nothing a test did not ask for (ClusterOptions::rebalance).
      "rebalancer.enabled = " +
      (opts_.rebalance ? "true\nrebalancer.interval = \"1s\"\n" : std::string("false\n")) +
      (opts_.prepare_timeout.empty() ? std::string()
                                     : "prepare_timeout = \"" + opts_.prepare_timeout + "\"\n") +
      opts_.cp_extra;
  return write_file(dir_ + "/cp.toml", cp_conf_).ok();
}

void ClusterHarness::set_cp_extra(const std::string& lines) {
  ASSERT_TRUE(write_file(dir_ + "/cp.toml", cp_conf_ + lines).ok());
}

pid_t ClusterHarness::start_in(int i, const std::vector<std::string>& argv,
                               const std::string& out) {
  return testing::spawn_process(argv, {out, /*truncate_log=*/true, netns(i)});
}

void ClusterHarness::stop_in(pid_t pid, int sig) {
  testing::stop_process(pid, sig);
}

ClusterHarness::~ClusterHarness() {
  for (int i = 0; i < machines(); ++i) kill_machine(i);
  kill_cp(SIGKILL);
  if (cgroup_made_) destroy_cgroup_tree(cgroup_parent_);
  for (const auto& ns : netns_made_)
    (void)std::system(("ip netns del " + ns + " >/dev/null 2>&1").c_str());
  for (auto it = mounts_made_.rbegin(); it != mounts_made_.rend(); ++it)
    (void)::umount2(it->c_str(), MNT_DETACH);
  for (pid_t& pid : slowfs_) reap(pid, SIGTERM);  // (unmounted: each is ending anyway)
  if (opts_.faked_wall_clocks) sweep_faketime_shm();
  // WEFT_E2E_KEEP=1 keeps the daemons' logs and state for a post-mortem.
  if (!std::getenv("WEFT_E2E_KEEP")) (void)remove_tree(dir_);
  lease_.reset();
}

pid_t ClusterHarness::spawn(const std::string& netns, const char* bin, const std::string& conf,
                            const std::string& log, const std::string& clock_file) {
  SpawnOptions o{log, false, netns, /*outside_systemd=*/true};
  if (!clock_file.empty()) {
    // The monotonic timers' shim first: libfaketime would move them by the step.
    o.env["LD_PRELOAD"] = std::string(WEFT_MONOTONIC_TIMERS_LIB) + ":" + kFaketimeLib;
    o.env["FAKETIME_TIMESTAMP_FILE"] = clock_file;
    o.env["FAKETIME_NO_CACHE"] = "1";  // the file is read at each call: a step is at once
    o.env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1";
  }
  return testing::spawn_process({bin, "-c", conf}, o);
}

std::string ClusterHarness::clock_file(int who) const {
  if (!opts_.faked_wall_clocks) return "";
  return who < 0 ? dir_ + "/clock-cp" : machines_.at(static_cast<size_t>(who)).dir + "/clock";
}

Status ClusterHarness::step_wall_clock(int who, int64_t offset_s) {
  if (!opts_.faked_wall_clocks) return make_error("the harness runs without faked_wall_clocks");
  // libfaketime's relative form: "+N" or "-N" seconds from the real clock.
  std::string text = (offset_s < 0 ? "" : "+") + std::to_string(offset_s) + "\n";
  return write_file_atomic(clock_file(who), text, 0644);
}

bool ClusterHarness::mount_state_fs(const std::string& dir, const std::string& delay_file) {
  if (!opts_.slow_state_fs) {
    if (opts_.state_fs_size.empty()) return true;
    mounts_made_.push_back(dir);
    return mount_small(dir, opts_.state_fs_size);
  }
  if (std::string(WEFT_SLOWFS_BIN).empty()) {
    ADD_FAILURE() << "weft-test-slowfs was not built: scripts/setup.sh --test installs "
                     "libfuse3-dev (then configure again)";
    return false;
  }
  std::string disk = dir + ".disk";
  if (opts_.state_fs_size.empty()) {
    if (!mkdir_p(disk).ok()) return false;
  } else {
    mounts_made_.push_back(disk);
    if (!mount_small(disk, opts_.state_fs_size)) return false;
  }
  if (!mkdir_p(dir).ok() || !write_file(delay_file, "0\n").ok()) return false;
  mounts_made_.push_back(dir);  // unmounted before the disk under it
  pid_t pid = testing::spawn_process({WEFT_SLOWFS_BIN, disk, dir, delay_file},
                                     SpawnOptions{dir + ".slowfs.log", false, "", true});
  if (pid < 0) {
    ADD_FAILURE() << "cannot run " << WEFT_SLOWFS_BIN;
    return false;
  }
  slowfs_.push_back(pid);
  // Served once the mount table has it (the server mounts before it serves).
  for (int waited = 0; waited < 10000; waited += 10) {
    auto table = read_file("/proc/self/mounts");
    if (table.ok() && table->find(" " + dir + " fuse") != std::string::npos) return true;
    sleep_ms(10);
  }
  ADD_FAILURE() << "weft-test-slowfs did not mount " << dir << ": "
                << read_file(dir + ".slowfs.log").value_or("");
  return false;
}

::testing::AssertionResult ClusterHarness::log_has(int who, const std::string& text) const {
  std::string file = who < 0 ? dir_ + "/cp.log" : agent_log(who);
  auto log = read_file(file);
  if (!log.ok()) return ::testing::AssertionFailure() << "cannot read " << file;
  if (log->find(text) == std::string::npos)
    return ::testing::AssertionFailure() << file << " does not say \"" << text << "\":\n" << *log;
  return ::testing::AssertionSuccess() << file << " says \"" << text << "\":\n" << *log;
}

::testing::AssertionResult ClusterHarness::log_lacks(int who, const std::string& text) const {
  std::string file = who < 0 ? dir_ + "/cp.log" : agent_log(who);
  if (!read_file(file).ok()) return ::testing::AssertionFailure() << "cannot read " << file;
  auto has = log_has(who, text);
  if (has) return ::testing::AssertionFailure() << has.message();
  return ::testing::AssertionSuccess();
}

Status ClusterHarness::set_disk_delay(int who, int ms) {
  if (!opts_.slow_state_fs) return make_error("the harness runs without slow_state_fs");
  std::string file = who < 0 ? dir_ + "/disk-delay-cp"
                             : machines_.at(static_cast<size_t>(who)).dir + "/disk-delay";
  return write_file_atomic(file, std::to_string(ms) + "\n", 0644);
}

Status ClusterHarness::fill_state_fs(int who) {
  if (opts_.state_fs_size.empty()) return make_error("the harness runs without state_fs_size");
  std::string path = (who < 0 ? cp_state_dir() : agent_state_dir(who)) + "/filler";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return sys_error("open " + path);
  std::string chunk(1 << 16, 'x');
  int err = 0;
  for (size_t size = chunk.size(); size >= 512 && err == 0; size /= 2) {
    for (;;) {
      ssize_t n = ::write(fd, chunk.data(), size);
      if (n > 0) continue;
      if (n < 0 && errno != ENOSPC) err = errno;
      break;  // this size no longer fits: a smaller one may
    }
  }
  ::close(fd);
  if (err) return errno_error(err, "write " + path);
  return {};
}

Status ClusterHarness::free_state_fs(int who) {
  std::string path = (who < 0 ? cp_state_dir() : agent_state_dir(who)) + "/filler";
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return sys_error("unlink " + path);
  return {};
}

std::vector<std::string> ClusterHarness::ended_on_their_own() {
  std::vector<std::string> out;
  // Reaped here, and so no longer running: the test that asks treats it as a failure.
  auto ended = [&out](pid_t& pid, const std::string& who) {
    int st = 0;
    if (pid <= 0 || ::waitpid(pid, &st, WNOHANG) != pid) return;
    pid = -1;
    out.push_back(who + (WIFEXITED(st) ? " (exit " + std::to_string(WEXITSTATUS(st)) + ")"
                                       : " (signal " + std::to_string(WTERMSIG(st)) + ")"));
  };
  ended(cp_, "the control plane");
  for (int i = 0; i < machines(); ++i) {
    Machine& m = machines_[static_cast<size_t>(i)];
    ended(m.agent, machine_id(i) + "'s weft-agent");
    ended(m.sidekick, machine_id(i) + "'s weft-sidekick");
    ended(m.hcs, machine_id(i) + "'s weft-hcs");
  }
  return out;
}

void ClusterHarness::signal_sidekick(int i, int sig) {
  pid_t pid = machines_.at(static_cast<size_t>(i)).sidekick;
  if (pid > 0) ::kill(pid, sig);
}

void ClusterHarness::reap(pid_t& pid, int sig) {
  testing::stop_process(pid, sig);
  pid = -1;
}

void ClusterHarness::start_cp() {
  ASSERT_LT(cp_, 0);
  cp_ =
      spawn(hub_, opts_.faked_wall_clocks ? WEFT_CONTROLPLANE_FAKETIME_BIN : WEFT_CONTROLPLANE_BIN,
            dir_ + "/cp.toml", dir_ + "/cp.log", clock_file(-1));
  for (int i = 0; i < 500; ++i) {
    if (cp("job.ls").ok()) return;
    sleep_ms(10);
  }
  FAIL() << "weft-controlplane did not answer: " << logs();
}

void ClusterHarness::kill_cp(int sig) {
  reap(cp_, sig);
}

void ClusterHarness::start_machine(int i) {
  Machine& m = machines_.at(static_cast<size_t>(i));
  ASSERT_LT(m.agent, 0) << "machine " << i << " is running";
  m.agent =
      spawn(m.netns, WEFT_AGENT_BIN, m.dir + "/agent.toml", m.dir + "/agent.log", clock_file(i));
  for (int t = 0; t < 500 && !agent(i, "agent.info").ok(); ++t) sleep_ms(10);
  // Sidekick and hcs after the agent: the agent makes the workload cgroup they watch.
  m.sidekick = spawn(m.netns, WEFT_SIDEKICK_BIN, m.dir + "/sidekick.toml", m.dir + "/sidekick.log");
  m.hcs = spawn(m.netns, WEFT_HCS_BIN, m.dir + "/hcs.toml", m.dir + "/hcs.log");
}

void ClusterHarness::kill_machine(int i) {
  Machine& m = machines_.at(static_cast<size_t>(i));
  reap(m.hcs, SIGKILL);
  reap(m.sidekick, SIGKILL);
  reap(m.agent, SIGKILL);
  // Its tasks die with it: every process of the machine's subtree.
  // Each task cgroup is killed, not the machine's root: on this kernel (6.18) a process
  // cloned (CLONE_INTO_CGROUP) into a cgroup created after cgroup.kill was written on
  // an ancestor two levels up is killed at once, so a restarted agent could run nothing.
  auto tasks = list_dir(m.cgroup_root + "/tasks");
  if (tasks.ok())
    for (const auto& t : *tasks)
      if (path_exists(m.cgroup_root + "/tasks/" + t + "/cgroup.kill"))
        (void)write_file(m.cgroup_root + "/tasks/" + t + "/cgroup.kill", "1");
}

void ClusterHarness::stop_machine(int i) {
  Machine& m = machines_.at(static_cast<size_t>(i));
  reap(m.hcs, SIGTERM);
  reap(m.sidekick, SIGTERM);
  reap(m.agent, SIGTERM);
}

bool ClusterHarness::machine_running(int i) const {
  return machines_.at(static_cast<size_t>(i)).agent > 0;
}

Result<json> ClusterHarness::cp(const std::string& method, const json& params) {
  TRY_ASSIGN(auto c, rpc::Client::connect(dir_ + "/cp.sock"));
  return c->call(method, params, 10000);
}

Result<json> ClusterHarness::agent(int i, const std::string& method, const json& params) {
  TRY_ASSIGN(auto c,
             rpc::Client::connect(machines_.at(static_cast<size_t>(i)).dir + "/agent.sock"));
  return c->call(method, params, 10000);
}

json ClusterHarness::wait_cp(const std::string& method, const json& params,
                             const std::function<bool(const json&)>& pred, int timeout_ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    auto r = cp(method, params);
    if (r.ok() && pred(*r)) return *r;
    sleep_ms(20);
  }
  return json();
}

bool ClusterHarness::wait_all_ready(int timeout_ms) {
  json r = wait_cp(
      "machine.ls", json::object(),
      [this](const json& j) {
        int ready = 0;
        // In service: ok, or degraded (placement takes it). The OOM probe's procfs
        // source is host-wide, so another test's OOM kill makes every "machine" of this
        // host degraded for the OOM window.
        for (const auto& m : j["machines"])
          ready += (m["state"] == "ok" || m["state"] == "degraded") && m["connected"] == true &&
                   m["sidekick_connected"] == true;
        return ready == machines();
      },
      timeout_ms);
  return !r.is_null();
}

Status ClusterHarness::cut_off(int i, Cut how) {
  std::string rules = "table inet weft_partition {\n";
  if (how != Cut::kCalls)
    rules += std::string("  chain input_drop {\n    type filter hook input priority 0;\n") +
             "    ip saddr " + kHubAddr + " drop\n  }\n";
  if (how != Cut::kAnswers)
    rules += std::string("  chain output_drop {\n    type filter hook output priority 0;\n") +
             "    ip daddr " + kHubAddr + " drop\n  }\n";
  rules += "}\n";
  std::string file = dir_ + "/partition-" + std::to_string(i) + ".nft";
  TRY(write_file(file, rules));
  TRY(run_in(i, "nft -f " + file));
  return {};
}

Status ClusterHarness::heal_link(int i) {
  TRY(run_in(i, "nft delete table inet weft_partition"));
  return {};
}

Result<std::string> ClusterHarness::run_in(int i, const std::string& command) const {
  std::string cmd = "timeout 20 ip netns exec " + netns(i) + " " + command + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return sys_error("popen " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0) return make_error(cmd + " exited " + std::to_string(rc) + ": " + out);
  return out;
}

int ClusterHarness::machine_index(const std::string& id) const {
  for (int i = 0; i < machines(); ++i)
    if (machine_id(i) == id) return i;
  return -1;
}

std::string ClusterHarness::logs() const {
  std::string out = "--- cp.log\n" + read_file(dir_ + "/cp.log").value_or("") + "\n";
  for (size_t i = 0; i < machines_.size(); ++i)
    for (const char* d : {"agent", "sidekick", "hcs"}) {
      auto text = read_file(machines_[i].dir + "/" + d + ".log").value_or("");
      if (text.size() > 4000) text = "..." + text.substr(text.size() - 4000);
      out += "--- m" + std::to_string(i) + " " + d + ".log\n" + text + "\n";
    }
  return out;
}

::testing::AssertionResult ClusterHarness::start_all() {
  if (!setup()) return ::testing::AssertionFailure() << "the cluster's setup failed\n" << logs();
  start_cp();
  for (int i = 0; i < machines(); ++i) start_machine(i);
  if (!wait_all_ready()) {
    auto ls = cp("machine.ls");
    return ::testing::AssertionFailure() << (ls.ok() ? ls->dump(2) : ls.error().str()) << logs();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace weft::testing
