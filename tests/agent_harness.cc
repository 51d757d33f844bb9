#include "tests/agent_harness.h"

#include <algorithm>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc/client.h"
#include "common/strings.h"

namespace weft::testing {

static std::string why_not_root_capable() {
  if (geteuid() != 0) return "needs root (run the suite as root, as CI does)";
  auto mount = HostPaths().cgroup2_mount();
  if (!mount.ok()) return "no cgroup2 mount: " + mount.error().str();
  if (!path_exists(*mount + "/cgroup.procs")) return "cgroup2 mount is not usable";
  return "";
}

std::string root_test_skip_reason() {
  std::string why = why_not_root_capable();
  // CI sets WEFT_REQUIRE_ROOT_TESTS: there a skipped root test is a failure, not a pass.
  if (!why.empty() && std::getenv("WEFT_REQUIRE_ROOT_TESTS")) {
    ADD_FAILURE() << "root tests are required here but cannot run: " << why;
  }
  return why;
}

void destroy_cgroup_tree(const std::string& dir) {
  if (!path_exists(dir)) return;
  auto entries = list_dir(dir);
  if (entries.ok()) {
    for (const auto& e : *entries) {
      struct stat st;
      std::string p = dir + "/" + e;
      if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) destroy_cgroup_tree(p);
    }
  }
  (void)write_file(dir + "/cgroup.kill", "1");
  for (int i = 0; i < 2000; ++i) {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return;
    sleep_ms(1);
  }
  ADD_FAILURE() << "could not remove cgroup " << dir << ": " << strerror(errno);
}

AgentHarness::AgentHarness(bool root_tasks) {
  dir_ = std::filesystem::temp_directory_path() / ("weft-agent-test-" + random_hex(5));
  EXPECT_TRUE(mkdir_p(dir_).ok());
  socket_ = dir_ + "/agent.sock";
  auto mount = HostPaths().cgroup2_mount();
  cgroup_root_ = mount.value_or("/sys/fs/cgroup") + "/weft-test-" + random_hex(5);
  if (mount.ok() && geteuid() == 0) lease_ = std::make_unique<SubtreeControlLease>(*mount);
  config_ = dir_ + "/agent.toml";
  std::string conf = "socket = \"" + socket_ + "\"\n" + "state_dir = \"" + dir_ + "/state\"\n" +
                     "cgroup_root = \"" + cgroup_root_ + "\"\n" +
                     "init_path = \"" WEFT_INIT_BIN "\"\n" + "log_level = \"debug\"\n" +
                     (root_tasks ? "allow_root_tasks = true\ndefault_task_user = \"\"\n" : "") +
                     "[labels]\ntest = \"yes\"\n";
  EXPECT_TRUE(write_file(config_, conf).ok());
}

void AgentHarness::state_on_tmpfs(uint64_t bytes) {
  tmpfs_ = dir_ + "/state";
  ASSERT_TRUE(mkdir_p(tmpfs_, 0700).ok());
  std::string opts = "size=" + std::to_string(bytes) + ",mode=0700";
  ASSERT_EQ(::mount("tmpfs", tmpfs_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()), 0)
      << "mount tmpfs on " << tmpfs_ << ": " << strerror(errno);
}

AgentHarness::~AgentHarness() {
  kill9();
  if (!tmpfs_.empty()) ::umount2(tmpfs_.c_str(), MNT_DETACH);
  destroy_cgroup_tree(cgroup_root_);
  (void)remove_tree(dir_);
  lease_.reset();
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  auto stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  return stat.ok() && stat->find(") Z ") == std::string::npos;
}

namespace {

constexpr const char* kLeaseDir = "/run/weft-test-cgroup2";

// Disables at `mount` every controller not in `before` (a cgroup.subtree_control).
void restore_subtree_control(const std::string& mount, const std::string& before) {
  auto now = read_file(mount + "/cgroup.subtree_control");
  if (!now.ok()) return;
  auto keep = split(trim(before), ' ');
  for (const auto& c : split(trim(*now), ' '))
    if (!c.empty() && std::find(keep.begin(), keep.end(), c) == keep.end())
      (void)write_file(mount + "/cgroup.subtree_control", "-" + c);
}

// Holders whose process is alive; the files of dead ones are removed.
int live_holders() {
  int live = 0;
  auto entries = list_dir(kLeaseDir);
  if (!entries.ok()) return 0;
  for (const auto& e : *entries) {
    if (e.rfind("holder-", 0) != 0) continue;
    if (process_alive(static_cast<pid_t>(std::atoi(e.c_str() + 7))))
      ++live;
    else
      (void)::unlink((std::string(kLeaseDir) + "/" + e).c_str());
  }
  return live;
}

// With no live holder left: what the first holder recorded goes back, and the
// bookkeeping goes away.
void restore_if_unheld(const std::string& mount) {
  if (live_holders() > 0) return;
  std::string before_file = std::string(kLeaseDir) + "/before";
  if (auto before = read_file(before_file); before.ok()) restore_subtree_control(mount, *before);
  (void)::unlink(before_file.c_str());
  (void)::rmdir(kLeaseDir);
}

class MountLock {
 public:
  explicit MountLock(const std::string& mount)
      : fd_(::open(mount.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~MountLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_;
};

}  // namespace

SubtreeControlLease::SubtreeControlLease(std::string mount) : mount_(std::move(mount)) {
  MountLock lock(mount_);
  restore_if_unheld(mount_);  // a dead last holder's record first
  (void)mkdir_p(kLeaseDir);
  std::string before_file = std::string(kLeaseDir) + "/before";
  if (!path_exists(before_file))
    (void)write_file(before_file, trim(read_file(mount_ + "/cgroup.subtree_control").value_or("")));
  holder_ = std::string(kLeaseDir) + "/holder-" + std::to_string(::getpid()) + "-" + random_hex(4);
  EXPECT_TRUE(write_file(holder_, "").ok()) << "cannot write " << holder_;
}

SubtreeControlLease::~SubtreeControlLease() {
  MountLock lock(mount_);
  (void)::unlink(holder_.c_str());
  restore_if_unheld(mount_);
}

void AgentHarness::add_config(const std::string& lines) {
  auto text = read_file(config_);
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(write_file(config_, lines + "\n" + *text).ok());
}

void AgentHarness::append_config(const std::string& lines) {
  auto text = read_file(config_);
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(write_file(config_, *text + "\n" + lines + "\n").ok());
}

void AgentHarness::start(const std::string& crash_at, const std::string& fail_at) {
  ASSERT_LT(pid_, 0) << "agent already running";
  testing::SpawnOptions o;
  o.log = dir_ + "/agent.log";
  o.unset_env = {"INVOCATION_ID"};
  for (const auto& [var, value] :
       {std::pair{"WEFT_AGENT_CRASH_AT", crash_at}, std::pair{"WEFT_AGENT_FAIL_AT", fail_at}}) {
    if (!value.empty())
      o.env[var] = value;
    else
      o.unset_env.push_back(var);
  }
  pid_t p = testing::spawn_process({WEFT_AGENT_BIN, "-c", config_}, o);
  ASSERT_GE(p, 0);
  pid_ = p;
  for (int i = 0; i < 1000; ++i) {
    auto c = rpc::Client::connect(socket_);
    if (c.ok() && (*c)->call("agent.info", json::object(), 2000).ok()) return;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      auto log = read_file(dir_ + "/agent.log");
      FAIL() << "weft-agent exited during start: " << log.value_or("");
    }
    sleep_ms(10);
  }
  FAIL() << "weft-agent did not answer on " << socket_;
}

void AgentHarness::kill9() {
  if (pid_ < 0) return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void AgentHarness::terminate() {
  if (pid_ < 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  // A clean shutdown exits 0; anything else (a sanitizer report among others) fails.
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "weft-agent did not exit cleanly on SIGTERM (status " << status
                  << "): " << read_file(dir_ + "/agent.log").value_or("");
  }
}

bool AgentHarness::wait_dead(int timeout_ms) {
  if (pid_ < 0) return true;
  for (int i = 0; i < timeout_ms / 10; ++i) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    }
    sleep_ms(10);
  }
  return false;
}

Result<json> AgentHarness::try_call(const std::string& method, const json& params) {
  TRY_ASSIGN(auto c, rpc::Client::connect(socket_));
  return c->call(method, params, 20000);
}

json AgentHarness::call(const std::string& method, const json& params) {
  auto r = try_call(method, params);
  if (!r.ok()) {
    ADD_FAILURE() << method << " failed: " << r.error().str();
    return json();
  }
  return *r;
}

json AgentHarness::wait_task(const std::string& id, const std::function<bool(const json&)>& pred,
                             int timeout_ms) {
  json last;
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    auto r = try_call("task.show", {{"id", id}});
    if (r.ok()) {
      last = *r;
      if (pred(last)) return last;
    }
    sleep_ms(20);
  }
  ADD_FAILURE() << "timed out waiting on task " << id << "; last: " << last.dump();
  return last;
}

json AgentHarness::wait_state(const std::string& id, const std::string& state, int timeout_ms) {
  return wait_task(
      id, [&](const json& t) { return t.value("state", "") == state; }, timeout_ms);
}

std::vector<std::string> AgentHarness::task_cgroups() const {
  std::vector<std::string> out;
  auto entries = list_dir(cgroup_root_ + "/tasks");
  if (!entries.ok()) return out;
  // Listed first: a sandbox made in between is then in the ids, not in the list.
  std::vector<std::string> sandboxes = sandbox_ids();
  for (const auto& e : *entries) {
    struct stat st;
    if (::stat((cgroup_root_ + "/tasks/" + e).c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
        std::find(sandboxes.begin(), sandboxes.end(), e) == sandboxes.end())
      out.push_back(e);
  }
  return out;
}

std::vector<std::string> AgentHarness::sandbox_ids() const {
  std::vector<std::string> out;
  if (pid_ < 0) return out;
  auto c = rpc::Client::connect(socket_);
  if (!c.ok()) return out;
  auto info = (*c)->call("agent.info", json::object(), 5000);
  if (!info.ok() || !info->contains("sandboxes")) return out;
  for (const auto& id : (*info)["sandboxes"]["ids"]) out.push_back(id.get<std::string>());
  return out;
}

}  // namespace weft::testing
