#include "agent/sandbox_pool.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <systemd/sd-event.h>

#include <algorithm>
#include <cstring>

#include "agent/init/handoff.h"
#include "agent/spawn.h"
#include "common/log.h"
#include "common/strings.h"

namespace weft::agent {

unsigned ns_bits(const TaskSpec& spec) {
  return (spec.ns.pid ? kNsPid : 0u) | (spec.ns.mount ? kNsMount : 0u) |
         (spec.ns.uts ? kNsUts : 0u) | (spec.ns.ipc ? kNsIpc : 0u) |
         (spec.ns.own_network() ? kNsNet : 0u);
}

std::string file_stamp(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) < 0) return {};
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
         std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

Result<Sandbox> start_sandbox(const std::string& init_path, const std::string& id,
                              const std::string& cgroup_dir, unsigned ns) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return sys_error("socketpair");
  Fd mine(sv[0]), theirs(sv[1]);
  SpawnRequest req;
  req.init_path = init_path;
  req.cgroup_dir = cgroup_dir;
  req.task_dir_fd = theirs.get();  // fd 3 of weft-init
  req.new_pid = ns & kNsPid;
  req.new_mount = ns & kNsMount;
  req.new_uts = ns & kNsUts;
  req.new_ipc = ns & kNsIpc;
  req.new_net = ns & kNsNet;
  std::string stamp = file_stamp(init_path);  // before it runs: a later swap is then seen
  req.init_argv = {"weft-init", "--await-task"};
  if (req.new_net) req.init_argv.push_back("--lo");  // up while it waits
  TRY_ASSIGN(Spawned sp, spawn_init(req));
  Sandbox s;
  s.id = id;
  s.ns = ns;
  s.pid = sp.pid;
  s.pidfd = std::move(sp.pidfd);
  s.sock = std::move(mine);
  s.init_stamp = std::move(stamp);
  return s;
}

std::string handoff_message(const std::vector<std::string>& init_argv, uint32_t nfds) {
  size_t body = 0;
  for (const auto& a : init_argv) body += a.size() + 1;
  handoff::Header h{handoff::kMagic, static_cast<uint32_t>(body),
                    static_cast<uint32_t>(init_argv.size()), nfds};
  if (body > handoff::kMaxBody || !handoff::header_ok(h)) return {};
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  out.reserve(sizeof h + body);
  for (const auto& a : init_argv) out.append(a.c_str(), a.size() + 1);
  return out;
}

Status hand_off(const Sandbox& s, const std::vector<std::string>& init_argv, int task_dir_fd,
                int files_fd) {
  uint32_t nfds = files_fd >= 0 ? 2u : 1u;
  std::string msg = handoff_message(init_argv, nfds);
  if (msg.empty()) return make_error("the task's start is too large to hand to a sandbox");
  int fds[2] = {task_dir_fd, files_fd};
  alignas(struct cmsghdr) char ctl[CMSG_SPACE(sizeof fds)];
  std::memset(ctl, 0, sizeof ctl);
  struct iovec iov = {msg.data(), msg.size()};
  struct msghdr m;
  std::memset(&m, 0, sizeof m);
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  struct cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  ssize_t n;
  do {
    n = ::sendmsg(s.sock.get(), &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return sys_error("hand the task to sandbox " + s.id);
  if (static_cast<size_t>(n) != msg.size())
    return make_error("the task's start did not fit in sandbox " + s.id + "'s socket");
  return {};
}

void end_sandbox(Sandbox& s) {
  if (s.pidfd.valid()) {
    (void)signal_pidfd(s.pidfd.get(), SIGKILL);
    siginfo_t si;
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(s.pidfd.get()), &si,
                    WEXITED) < 0 &&
           errno == EINTR) {
    }
  }
  s.pidfd.reset();
  s.sock.reset();
  s.pid = -1;
}

}  // namespace weft::agent

namespace weft::agent {

namespace {
// How long after a sandbox was taken the pool starts making more.
constexpr uint64_t kQuietUs = 5'000;
}  // namespace

SandboxPool::SandboxPool(EventLoop& loop, CgroupTree& cgroups, Config cfg, TaskDirs& dirs,
                         std::function<bool(const std::string&)> id_in_use)
    : loop_(loop),
      cgroups_(cgroups),
      cfg_(std::move(cfg)),
      dirs_(dirs),
      id_in_use_(std::move(id_in_use)) {}

SandboxPool::~SandboxPool() {
  refill_.reset();
  while (!ready_.empty()) {
    discard(ready_.front(), /*remove_dir=*/true);
    ready_.pop_front();
  }
}

void SandboxPool::start() {
  ns_ = ns_bits(TaskSpec{});  // until a task asks for others
  arm_refill(0);
}

std::vector<std::string> SandboxPool::ids() const {
  std::vector<std::string> out;
  for (const auto& sb : ready_) out.push_back(sb.id);
  return out;
}

std::optional<Sandbox> SandboxPool::take(const TaskSpec& spec) {
  if (cfg_.size == 0 || !spec.image.empty() || spec.package ||
      spec.ns.network == NetworkMode::kBridge)
    return std::nullopt;
  unsigned ns = ns_bits(spec);
  ns_ = ns;  // the next ones are made for what was asked last
  std::optional<Sandbox> out;
  std::string stamp = file_stamp(cfg_.init_path);
  for (auto it = ready_.begin(); it != ready_.end();) {
    if (it->init_stamp != stamp) {
      // weft-init was replaced (a package upgrade) since this one started: the new
      // agent's argv is for the new binary.
      discard(*it, /*remove_dir=*/true);
      it = ready_.erase(it);
      continue;
    }
    if (it->ns != ns) {
      ++it;
      continue;
    }
    out = std::move(*it);
    ready_.erase(it);
    break;
  }
  refill_.reset();
  arm_refill(kQuietUs);
  return out;
}

void SandboxPool::arm_refill(uint64_t after_us) {
  if (cfg_.size == 0 || !failure_.empty() || refill_.active()) return;
  size_t ready = 0;
  for (const auto& sb : ready_) ready += sb.ns == ns_;
  if (ready >= cfg_.size) return;
  auto src = loop_.add_timer_in(after_us, [this] {
    refill_.reset();
    refill();
    arm_refill(0);
  });
  if (!src.ok()) return;
  // Only when nothing else is pending: a start never waits behind the pool's upkeep.
  (void)src->set_priority(SD_EVENT_PRIORITY_IDLE);
  refill_ = std::move(src).value();
}

void SandboxPool::refill() {
  if (ready_.size() >= cfg_.size) {
    // Full of sandboxes for namespaces no longer asked for: the oldest of them goes.
    auto it =
        std::find_if(ready_.begin(), ready_.end(), [&](const Sandbox& sb) { return sb.ns != ns_; });
    if (it == ready_.end()) return;
    discard(*it, /*remove_dir=*/true);
    ready_.erase(it);
  }
  std::string id;
  do {
    id = random_hex(8);
  } while (id_in_use_(id) || std::any_of(ready_.begin(), ready_.end(),
                                         [&](const Sandbox& sb) { return sb.id == id; }));
  // The task's directory and its logs/ too (recycled ones when there are: TaskDirs),
  // off the start.
  Status made = dirs_.make(id);
  if (made.ok()) made = cgroups_.create_task(id, {});
  Result<Sandbox> sb = made.ok() ? start_sandbox(cfg_.init_path, id, cgroups_.task_dir(id), ns_)
                                 : Result<Sandbox>(std::move(made).error());
  if (!sb.ok()) {
    (void)cgroups_.remove_task(id);
    dirs_.remove(id);
    failure_ = sb.error().str();
    log_warn("sandboxes are not made ahead (sandbox_pool stopped); each start makes its own",
             {{"ERROR", failure_}});
    return;
  }
  ready_.push_back(std::move(sb).value());
}

void SandboxPool::discard(Sandbox& s, bool remove_dir) {
  end_sandbox(s);
  if (auto st = cgroups_.remove_task(s.id); !st.ok())
    log_error("could not remove a sandbox's cgroup",
              {{"CGROUP", cgroups_.task_dir(s.id)}, {"ERROR", st.error().str()}});
  if (remove_dir) dirs_.remove(s.id);
}

}  // namespace weft::agent
