#include "agent/runtime.h"
#include "common/strings.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>

namespace weft::agent {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// Runs in the child between clone and exec: only async-signal-safe calls. With
// CLONE_VM it runs on the agent's memory (on its own stack, the agent's thread
// suspended): it writes nothing but its own locals. Not instrumented by ASan, whose
// stack poisoning would outlive the child in the shared shadow memory.
[[noreturn]] __attribute__((no_sanitize("address"))) void child_exec(const SpawnRequest& req,
                                                                     char* const* argv, int err_w,
                                                                     int procs_fd) {
  int err = 0;
  if (procs_fd >= 0) {
    // Enter the cgroup before running anything else.
    if (::write(procs_fd, "0", 1) != 1) err = errno;
  }
  if (!err && req.netns_fd >= 0 && ::setns(req.netns_fd, CLONE_NEWNET) < 0) err = errno;
  if (!err) {
    int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0) err = errno;
    for (int i = 0; i < 3 && !err; ++i)
      if (::dup2(req.stdio[i] >= 0 ? req.stdio[i] : null_fd, i) < 0) err = errno;
    // fd 4 (the files' contents) goes in place first if the error pipe sits there.
    if (!err && req.files_fd >= 0 && err_w == 4) {
      err_w = ::fcntl(err_w, F_DUPFD_CLOEXEC, 5);
      if (err_w < 0) err = errno;
    }
    int files_fd = req.files_fd;
    if (!err && files_fd >= 0 && files_fd <= 3) {
      files_fd = ::fcntl(files_fd, F_DUPFD_CLOEXEC, 5);
      if (files_fd < 0) err = errno;
    }
    if (!err) {
      // dup2 onto itself would keep close-on-exec set; clear it explicitly then.
      if (req.task_dir_fd == 3) {
        if (::fcntl(3, F_SETFD, 0) < 0) err = errno;
      } else if (::dup2(req.task_dir_fd, 3) < 0) {
        err = errno;
      }
    }
    if (!err) {
      // Everything above 3 except the error pipe is the agent's business only; all of it
      // is close-on-exec already, this makes sure.
      ::syscall(SYS_close_range, 4, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
      if (files_fd >= 0) {
        if (files_fd == 4 ? ::fcntl(4, F_SETFD, 0) < 0 : ::dup2(files_fd, 4) < 0) err = errno;
      }
    }
    if (!err) {
      // weft-init starts with every signal blocked and reads them from a signalfd; a
      // signal that arrived before it was ready would otherwise be dropped, since
      // pid 1 of a namespace ignores signals it has no handler for.
      sigset_t all;
      sigfillset(&all);
      ::sigprocmask(SIG_SETMASK, &all, nullptr);
      ::execve(req.init_path.c_str(), argv, environ);
      err = errno;
    }
  }
  (void)!::write(err_w, &err, sizeof err);
  ::_exit(127);
}

struct VforkArgs {
  const SpawnRequest* req;
  char* const* argv;
  int err_w;
};

__attribute__((no_sanitize("address"))) int vfork_child(void* p) {
  auto* a = static_cast<VforkArgs*>(p);
  child_exec(*a->req, a->argv, a->err_w, -1);
}

#if defined(__x86_64__)
constexpr bool kHaveClone3OnStack = true;
// clone3 whose child runs fn(arg) on the stack `args` names, as glibc's own clone3 (used by
// posix_spawn) does: glibc 2.36 exports no clone3, and a child that returned from
// syscall() onto a fresh stack would have no frame to return to. fn must not return
// (it executes or _exits); if it does, the child exits with its value.
__attribute__((noinline)) long clone3_on_stack(struct clone_args* args, int (*fn)(void*),
                                               void* arg) {
  long ret;
  register void* r12 asm("r12") = reinterpret_cast<void*>(fn);
  register void* r13 asm("r13") = arg;
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"  // the child: outermost frame, on its own stack
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov %[exit_nr], %%eax\n\t"
      "syscall\n\t"
      "hlt\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "a"(static_cast<long>(SYS_clone3)), "D"(args), "S"(sizeof *args), "r"(r12),
        "r"(r13), [exit_nr] "i"(SYS_exit)
      : "rcx", "r11", "memory");
  if (ret < 0) {  // the kernel's -errno, as syscall() reports it
    errno = static_cast<int>(-ret);
    return -1;
  }
  return ret;
}
#else
constexpr bool kHaveClone3OnStack = false;
long clone3_on_stack(struct clone_args*, int (*)(void*), void*) {
  errno = ENOSYS;
  return -1;
}
#endif

}  // namespace

Result<Identity> resolve_identity(const std::string& user, const std::string& group) {
  Identity id;
  if (user.empty() && group.empty()) return id;
  id.set = true;
  char buf[16384];
  if (!user.empty()) {
    struct passwd pw, *res = nullptr;
    if (all_digits(user)) {
      id.uid = std::stol(user);
      if (getpwuid_r(static_cast<uid_t>(id.uid), &pw, buf, sizeof buf, &res) == 0 && res) {
        id.gid = res->pw_gid;
      } else {
        id.gid = id.uid;
      }
    } else {
      if (getpwnam_r(user.c_str(), &pw, buf, sizeof buf, &res) != 0 || !res)
        return field_error("user", "no such user '" + user + "'");
      id.uid = res->pw_uid;
      id.gid = res->pw_gid;
    }
    if (res) {
      int n = 64;
      std::vector<gid_t> g(64);
      if (getgrouplist(res->pw_name, static_cast<gid_t>(id.gid), g.data(), &n) >= 0) {
        g.resize(static_cast<size_t>(n));
        id.groups = g;
      }
    }
  }
  if (!group.empty()) {
    if (all_digits(group)) {
      id.gid = std::stol(group);
    } else {
      struct group gr, *res = nullptr;
      if (getgrnam_r(group.c_str(), &gr, buf, sizeof buf, &res) != 0 || !res)
        return field_error("group", "no such group '" + group + "'");
      id.gid = res->gr_gid;
    }
    if (user.empty()) id.uid = -1;
    id.groups = {static_cast<gid_t>(id.gid)};
  }
  if (id.groups.empty() && id.gid >= 0) id.groups = {static_cast<gid_t>(id.gid)};
  return id;
}

namespace {

// The image's copy of etc/<name>: the top-most layer that has it, read inside that
// layer (RESOLVE_IN_ROOT: a symlink in a hostile layer cannot name a host file). A
// whiteout in a higher layer hides it.
std::optional<std::string> image_file(const std::vector<std::string>& roots_top_first,
                                      const char* name) {
  for (const auto& root : roots_top_first) {
    Fd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) continue;
    std::string rel = std::string("etc/") + name;
    struct stat st {};
    if (::fstatat(dir.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISCHR(st.st_mode) &&
        st.st_rdev == 0)
      return std::nullopt;  // deleted by this layer
    struct open_how how {};
    how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    Fd f(static_cast<int>(::syscall(SYS_openat2, dir.get(), rel.c_str(), &how, sizeof how)));
    if (!f.valid()) continue;
    if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    std::string text;
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(f.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > (4u << 20)) break;  // a passwd file is not this large
    }
    return text;
  }
  return std::nullopt;
}

std::optional<long> small_id(const std::string& s) {
  if (!all_digits(s) || s.size() > 10) return std::nullopt;
  unsigned long v = std::stoul(s);
  if (v > 0xfffffffeul) return std::nullopt;
  return static_cast<long>(v);
}

}  // namespace

Result<Identity> resolve_identity_in_image(const std::string& user_spec, const std::string& group,
                                           const std::vector<std::string>& roots_top_first) {
  Identity id;
  std::string user = user_spec, grp = group;
  if (auto colon = user.find(':'); colon != std::string::npos) {  // OCI "user:group"
    if (grp.empty()) grp = user.substr(colon + 1);
    user = user.substr(0, colon);
  }
  if (user.empty() && grp.empty()) return id;
  id.set = true;
  auto passwd = image_file(roots_top_first, "passwd");
  auto groups = image_file(roots_top_first, "group");
  std::string user_name;
  if (!user.empty()) {
    auto num = small_id(user);
    bool found = false;
    if (passwd) {
      for (const auto& line : split(*passwd, '\n')) {
        auto f = split(line, ':');
        if (f.size() < 4) continue;
        auto uid = small_id(f[2]), gid = small_id(f[3]);
        if (!uid || !gid) continue;
        if ((num && *uid == *num) || (!num && f[0] == user)) {
          id.uid = *uid;
          id.gid = *gid;
          user_name = f[0];
          found = true;
          break;
        }
      }
    }
    if (!found) {
      if (!num) return field_error("user", "no user '" + user + "' in the image's /etc/passwd");
      id.uid = *num;
      id.gid = *num;
    }
  }
  if (!grp.empty()) {
    auto num = small_id(grp);
    bool found = false;
    if (num) {
      id.gid = *num;
      found = true;
    } else if (groups) {
      for (const auto& line : split(*groups, '\n')) {
        auto f = split(line, ':');
        if (f.size() >= 3 && f[0] == grp && small_id(f[2])) {
          id.gid = *small_id(f[2]);
          found = true;
          break;
        }
      }
    }
    if (!found) return field_error("group", "no group '" + grp + "' in the image's /etc/group");
    if (user.empty()) id.uid = -1;
  }
  id.groups = {static_cast<gid_t>(id.gid)};
  // Supplementary groups: those of the image's /etc/group that list the user.
  if (groups && !user_name.empty() && grp.empty()) {
    for (const auto& line : split(*groups, '\n')) {
      auto f = split(line, ':');
      if (f.size() < 4) continue;
      auto gid = small_id(f[2]);
      if (!gid || *gid == id.gid) continue;
      for (const auto& m : split(f[3], ','))
        if (m == user_name && id.groups.size() < 64) id.groups.push_back(static_cast<gid_t>(*gid));
    }
  }
  return id;
}

Result<Identity> task_identity(const std::string& user, const std::string& group,
                               const std::string& default_user, bool allow_root,
                               const std::vector<std::string>* image_roots) {
  std::string u = user.empty() ? default_user : user;
  Identity id;
  if (image_roots) {
    auto in_image = resolve_identity_in_image(u, group, *image_roots);
    // The agent's default user may be absent from the image: then it is the host's.
    if (!in_image.ok() && user.empty() && u == default_user) {
      TRY_ASSIGN(id, resolve_identity(u, group));
    } else {
      TRY_ASSIGN(id, std::move(in_image));
    }
  } else {
    TRY_ASSIGN(id, resolve_identity(u, group));
  }
  if (allow_root) return id;
  bool root_uid = !id.set || id.uid == 0 || (id.uid < 0 && ::getuid() == 0);
  bool root_gid = id.gid == 0;
  for (gid_t g : id.groups) root_gid = root_gid || g == 0;
  if (root_uid)
    return field_error("user",
                       "tasks may not run as root on this machine (agent.toml: "
                       "allow_root_tasks = false)");
  if (root_gid)
    return field_error("group",
                       "tasks may not run with group root on this machine (agent.toml: "
                       "allow_root_tasks = false)");
  return id;
}

TaskSpec apply_image_defaults(const TaskSpec& spec, const std::vector<std::string>& entrypoint,
                              const std::vector<std::string>& cmd,
                              const std::vector<std::string>& env, const std::string& workdir,
                              const std::string& user) {
  TaskSpec s = spec;
  if (s.argv.empty()) {
    s.argv = entrypoint;
    s.argv.insert(s.argv.end(), cmd.begin(), cmd.end());
  }
  for (const auto& kv : env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    s.env.emplace(kv.substr(0, eq), kv.substr(eq + 1));  // the spec's own win
  }
  if (s.cwd.empty() && !workdir.empty() && workdir[0] == '/') s.cwd = workdir;
  if (s.user.empty() && s.group.empty()) s.user = user;
  return s;
}

Result<std::string> allowed_bind_source(const std::string& source,
                                        const std::vector<std::string>& allowed, size_t index) {
  std::string field = "mounts[" + std::to_string(index) + "].source";
  char resolved[PATH_MAX];
  if (!::realpath(source.c_str(), resolved))
    return field_error(field, "'" + source + "': " + std::strerror(errno));
  std::string r = resolved;
  if (r.find(':') != std::string::npos) return field_error(field, "resolves to a path with ':'");
  for (const auto& a : allowed) {
    char ra[PATH_MAX];
    if (!::realpath(a.c_str(), ra)) continue;
    std::string root = ra;
    if (root == "/") continue;
    if (r == root || r.rfind(root + "/", 0) == 0) return r;
  }
  return field_error(field, "'" + source +
                                "' is not under a host path this machine allows (agent.toml: "
                                "[volumes] allowed_host_paths)");
}

Result<Fd> files_memfd(const TaskSpec& spec) {
  Fd fd(
      static_cast<int>(::syscall(SYS_memfd_create, "weft-files", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!fd.valid()) return sys_error("memfd_create");
  for (const auto& f : spec.files) {
    size_t off = 0;
    while (off < f.content.size()) {
      ssize_t w = ::write(fd.get(), f.content.data() + off, f.content.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return sys_error("write the task's files");
      off += static_cast<size_t>(w);
    }
  }
  if (::lseek(fd.get(), 0, SEEK_SET) != 0) return sys_error("lseek");
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

namespace {

// Starts the child in `mode`: its pid, the pidfd in *pidfd. The child reports a failed
// exec through `err_w`.
Result<pid_t> clone_init(const SpawnRequest& req, SpawnRequest::Mode mode, char** argv, int err_w,
                         int* pidfd) {
  uint64_t ns_flags = 0;
  if (req.new_pid) ns_flags |= CLONE_NEWPID;
  if (req.new_mount) ns_flags |= CLONE_NEWNS;
  if (req.new_uts) ns_flags |= CLONE_NEWUTS;
  if (req.new_ipc) ns_flags |= CLONE_NEWIPC;
  if (req.new_net) ns_flags |= CLONE_NEWNET;
  pid_t pid = -1;
  if (mode == SpawnRequest::Mode::kVfork || mode == SpawnRequest::Mode::kClone3) {
    Fd cg(::open(req.cgroup_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!cg.valid()) return sys_error("open cgroup " + req.cgroup_dir);
    struct clone_args ca;
    std::memset(&ca, 0, sizeof ca);
    ca.flags = CLONE_INTO_CGROUP | CLONE_PIDFD | ns_flags;
    ca.pidfd = reinterpret_cast<uint64_t>(pidfd);
    ca.exit_signal = SIGCHLD;
    ca.cgroup = static_cast<uint64_t>(cg.get());
    if (mode == SpawnRequest::Mode::kVfork) {
      // The child's stack: it runs until its exec (the agent's thread waits meanwhile).
      constexpr size_t kStack = 64 * 1024;
      void* stack = ::mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
      if (stack == MAP_FAILED) return sys_error("mmap the child's stack");
      VforkArgs va{&req, argv, err_w};
      ca.flags |= CLONE_VM | CLONE_VFORK;
      ca.stack = reinterpret_cast<uint64_t>(stack);
      ca.stack_size = kStack;
      pid = static_cast<pid_t>(clone3_on_stack(&ca, vfork_child, &va));
      int saved = errno;
      ::munmap(stack, kStack);
      errno = saved;
    } else {
      pid = static_cast<pid_t>(::syscall(SYS_clone3, &ca, sizeof ca));
      if (pid == 0) child_exec(req, argv, err_w, -1);
    }
    if (pid < 0) return sys_error("clone3 into " + req.cgroup_dir);
    return pid;
  }
  Fd procs(::open((req.cgroup_dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  if (!procs.valid()) return sys_error("open " + req.cgroup_dir + "/cgroup.procs");
  // clone(2) without a stack argument behaves like fork with namespace flags.
  pid = static_cast<pid_t>(::syscall(SYS_clone, ns_flags | SIGCHLD, nullptr, nullptr, nullptr, 0));
  if (pid == 0) child_exec(req, argv, err_w, procs.get());
  if (pid < 0) return sys_error("clone");
  *pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (*pidfd < 0) {
    Error e = sys_error("pidfd_open");
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return e;
  }
  return pid;
}

// What clone3 answers where it cannot be used at all: absent (ENOSYS), clone_args
// larger than the kernel knows (E2BIG: no CLONE_INTO_CGROUP), a flag it does not know
// (EINVAL), or a seccomp policy that refuses it (EPERM, ENOSYS).
bool clone3_missing(int errnum) {
  return errnum == ENOSYS || errnum == E2BIG || errnum == EINVAL || errnum == EPERM;
}

// Set once clone3 failed and a fork-style start worked: later starts go straight there.
std::atomic<bool> g_clone3_unusable{false};

}  // namespace

SpawnRequest join_request(std::string init_path, std::string cgroup_dir, int task_pidfd,
                          std::vector<std::string> init_argv) {
  SpawnRequest req;
  req.init_path = std::move(init_path);
  req.cgroup_dir = std::move(cgroup_dir);
  req.task_dir_fd = task_pidfd;  // fd 3 of weft-init --join-pid
  req.init_argv = std::move(init_argv);
  req.new_pid = req.new_mount = req.new_uts = req.new_ipc = req.new_net = false;
  return req;
}

Result<Spawned> spawn_init(const SpawnRequest& req) {
  std::vector<char*> argv;
  for (const auto& s : req.init_argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);

  int errp[2];
  if (::pipe2(errp, O_CLOEXEC) < 0) return sys_error("pipe");
  Fd err_r(errp[0]), err_w(errp[1]);

  Spawned out;
  int pidfd = -1;
  SpawnRequest::Mode mode = req.mode;
  if (mode == SpawnRequest::Mode::kVfork && !kHaveClone3OnStack) mode = SpawnRequest::Mode::kClone3;
  if (mode != SpawnRequest::Mode::kFork && g_clone3_unusable.load(std::memory_order_relaxed))
    mode = SpawnRequest::Mode::kFork;
  Result<pid_t> pid = clone_init(req, mode, argv.data(), err_w.get(), &pidfd);
  if (!pid && mode != SpawnRequest::Mode::kFork && clone3_missing(pid.error().errnum)) {
    // A kernel without clone3 (before 5.3) or without CLONE_INTO_CGROUP (before 5.7), or
    // a seccomp policy around the agent that refuses clone3 (container runtimes' default
    // profiles did): start it the old way, and from now on only that way once it worked.
    Error first = pid.error();
    mode = SpawnRequest::Mode::kFork;
    pid = clone_init(req, mode, argv.data(), err_w.get(), &pidfd);
    if (!pid) {
      Error again = pid.error();
      return std::move(again).wrap(first.str() + "; then the fork-style start");
    }
    g_clone3_unusable.store(true, std::memory_order_relaxed);
  }
  if (!pid) return pid.error();
  out.used = mode;
  out.pid = *pid;
  out.pidfd = Fd(pidfd);
  err_w.reset();
  int child_err = 0;
  ssize_t n;
  do {
    n = ::read(err_r.get(), &child_err, sizeof child_err);
  } while (n < 0 && errno == EINTR);
  if (n == sizeof child_err) {
    ::waitpid(*pid, nullptr, 0);
    return errno_error(child_err, "start " + req.init_path);
  }
  return out;
}

Status signal_pidfd(int pidfd, int sig) {
  if (::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) < 0)
    return sys_error("pidfd_send_signal");
  return {};
}

}  // namespace weft::agent
