#include "agent/spawn.h"

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
