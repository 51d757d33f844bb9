// weft-init: the tiny per-task init. Started by weft-agent inside the task's cgroup and
// namespaces; it is pid 1 of the task's pid namespace when there is one.
//
//  - sets up the task's mount namespace (private propagation, optional pivot_root into
//    a rootfs with a fresh /proc and a minimal /dev), hostname and loopback;
//  - starts the main process with the task's user, groups, cwd and environment;
//  - copies the main process's stdout/stderr into size-rotated log files (it keeps
//    doing so while the agent is down);
//  - reaps every zombie and forwards catchable signals to the main process;
//  - when the main process exits, records its wait status in <task dir>/exit (write,
//    rename: never a torn record) so the agent learns it even if it was down, then exits.
//    No fsync: the record must outlive the agent, not the machine (a machine that
//    crashes kills the task too, and the agent learns that from the boot id;
//    docs/decisions.md, "The exit record without fsync").
//
// Written in plain C-style C++ with no libstdc++ and linked statically so its resident
// size stays well under 1 MiB. Usage (argv is built by the agent, agent/init/argv.cc; parsed by
// args.cc):
//   weft-init --task-dir-fd N --incarnation N [--uid U --gid G --groups a,b]
//             [--cwd D] [--hostname H] [--rootfs DIR] [--proc] [--lo]
//             [--overlay-layers DIR --overlay-lower A:B --overlay-upper U --overlay-work W]
//             [--log-max-bytes N] [--log-max-files N] [--env K=V]... -- argv...
//   weft-init --join-pid PID [--uid U --gid G --groups a,b] [--cwd D]
//             [--seccomp-unconfined] [--env K=V]... -- /abs/argv...   (fd 3: PID's pidfd)
//   weft-init --await-task [--lo]  (a sandbox made ahead: the first usage's argv, the
//                                   task directory and the files arrive on fd 3,
//                                   agent/init/handoff.h; --lo: bring lo up first)
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/init/args.h"
#include "agent/init/confine.h"
#include "agent/init/handoff.h"
#include "agent/logfiles.h"

namespace {

weft_init::Args opt;
int log_dir_fd = -1;
char setup_error[512];

void note_setup_error(const char* what) {
  snprintf(setup_error, sizeof setup_error, "%s: %s", what, strerror(errno));
}

// ---- the exit record ----

enum { kStageCredentials = 1, kStageChdir = 2, kStageExec = 3, kStageConfine = 4 };

const char* stage_name(int stage) {
  switch (stage) {
    case kStageCredentials:
      return "credentials";
    case kStageChdir:
      return "chdir";
    case kStageConfine:
      return "confine";
    default:
      return "exec";
  }
}

int exec_stage = 0;

void init_say(const char* msg);

// Returns false when the record could not be written (full or read-only disk):
// the agent then learns the status from the process itself when it is up, and the
// failure is in the task's stderr log.
bool write_exit_record(bool have_status, int status, int exec_errno) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "incarnation=%lu\n", opt.incarnation);
  if (have_status) n += snprintf(buf + n, sizeof buf - n, "status=%d\n", status);
  if (exec_errno)
    n += snprintf(buf + n, sizeof buf - n, "exec_errno=%d\nexec_stage=%s\n", exec_errno,
                  stage_name(exec_stage));
  if (setup_error[0]) n += snprintf(buf + n, sizeof buf - n, "setup_error=%s\n", setup_error);
  if (n > static_cast<int>(sizeof buf) - 1) n = sizeof buf - 1;
  const char* failed = nullptr;
  // The file is the last record's, recycled with the task's directory (agent/task_dirs.h):
  // overwritten from its start and cut to this record's length, never truncated to zero
  // first. On ext4 a file truncated to zero is flushed to disk when it is closed (the
  // auto_da_alloc heuristic), which put block I/O on every task's end.
  int fd = openat(opt.task_dir_fd, "exit.tmp", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    failed = "open";
  } else {
    ssize_t w;
    do {
      w = pwrite(fd, buf, static_cast<size_t>(n), 0);
    } while (w < 0 && errno == EINTR);
    struct stat st;
    if (w != n)
      failed = "write";
    else if (fstat(fd, &st) < 0 || (st.st_size > n && ftruncate(fd, n) < 0))
      failed = "truncate";
    close(fd);
    // The page cache outlives any process: once renamed, the agent (or its next start)
    // reads the whole record.
    if (!failed && renameat(opt.task_dir_fd, "exit.tmp", opt.task_dir_fd, "exit") < 0)
      failed = "rename";
  }
  if (failed) {
    char msg[160];
    snprintf(msg, sizeof msg, "cannot record the exit status (%s): %s", failed, strerror(errno));
    init_say(msg);
    return false;
  }
  return true;
}

// ---- logs: one growing sequence of files per stream ----

struct LogStream {
  const char* name;
  int pipe_fd;
  int file_fd;
  unsigned seq;
  unsigned long long size;
};

LogStream streams[2] = {{"stdout", -1, -1, 0, 0}, {"stderr", -1, -1, 0, 0}};

// Lowest and highest sequence numbers present for a stream, and their count.
void scan_logs(const char* stream, unsigned* lo, unsigned* hi, unsigned* count) {
  *lo = 0;
  *hi = 0;
  *count = 0;
  // A fresh open file description: a dup would share the directory offset, and the
  // next scan would start where this one ended.
  int fd = openat(log_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  while (struct dirent* e = readdir(d)) {
    unsigned seq;
    if (!weft_log_parse_name(e->d_name, stream, &seq)) continue;
    if (*count == 0 || seq < *lo) *lo = seq;
    if (seq > *hi) *hi = seq;
    ++*count;
  }
  closedir(d);
}

void add_dropped(const char* stream, unsigned long long bytes) {
  char name[64], buf[32];
  snprintf(name, sizeof name, "%s.dropped", stream);
  unsigned long long old = 0;
  int fd = openat(log_dir_fd, name, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n > 0) {
    buf[n] = 0;
    old = strtoull(buf, nullptr, 10);
  }
  int len = snprintf(buf, sizeof buf, "%llu\n", old + bytes);
  if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, len, 0) == len) {
  }
  close(fd);
}

// Starts the next file of a stream and deletes the oldest beyond max_files.
void open_next(LogStream* s) {
  if (s->file_fd >= 0) close(s->file_fd);
  unsigned lo, hi, count;
  scan_logs(s->name, &lo, &hi, &count);
  s->seq = hi + 1;
  char name[64];
  weft_log_name(name, sizeof name, s->name, s->seq);
  s->file_fd = openat(log_dir_fd, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  s->size = 0;
  ++count;
  while (count > opt.log_max_files && lo < s->seq) {
    weft_log_name(name, sizeof name, s->name, lo);
    struct stat st;
    if (fstatat(log_dir_fd, name, &st, 0) == 0 && unlinkat(log_dir_fd, name, 0) == 0) {
      add_dropped(s->name, static_cast<unsigned long long>(st.st_size));
      --count;
    }
    ++lo;
  }
}

// Writes a chunk, starting new files as needed so that no file exceeds the limit.
void log_write(LogStream* s, const char* data, size_t n) {
  while (n > 0) {
    if (s->file_fd < 0 || s->size >= opt.log_max_bytes) open_next(s);
    if (s->file_fd < 0) {
      add_dropped(s->name, n);
      return;
    }
    size_t room = static_cast<size_t>(opt.log_max_bytes - s->size);
    size_t len = n < room ? n : room;
    ssize_t w = write(s->file_fd, data, len);
    if (w <= 0) {
      add_dropped(s->name, n);
      return;
    }
    s->size += static_cast<unsigned long long>(w);
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// ---- journald: the same output as entries of the native protocol (optional) ----
//
// libsystemd's sd_journal_sendv cannot be linked into this static program; this is the
// documented native protocol it speaks (systemd.io/JOURNAL_NATIVE_PROTOCOL): one datagram
// of "FIELD=value\n" lines per entry to /run/systemd/journal/socket. A line longer than
// kJournalLine is sent in pieces; a failed send drops the entry (the files have it).

int journal_fd = -1;
constexpr size_t kJournalLine = 16384;
char journal_part[2][kJournalLine];  // the unfinished line of each stream
size_t journal_len[2];
char journal_fields[4096];  // "SYSLOG_IDENTIFIER=...\nKEY=VALUE\n..."
size_t journal_fields_len;

void journal_open() {
  if (opt.njournal == 0) return;
  int n = snprintf(journal_fields, sizeof journal_fields, "SYSLOG_IDENTIFIER=%s\n",
                   strchr(opt.journal_fields[0], '=') + 1);
  for (int i = 0; i < opt.njournal && n > 0 && static_cast<size_t>(n) < sizeof journal_fields; ++i)
    n += snprintf(journal_fields + n, sizeof journal_fields - static_cast<size_t>(n), "%s\n",
                  opt.journal_fields[i]);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof journal_fields) return;  // too long: no copy
  journal_fields_len = static_cast<size_t>(n);
  journal_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const char* path = opt.journal_socket;
  if (strlen(path) >= sizeof a.sun_path) return;
  memcpy(a.sun_path, path, strlen(path) + 1);
  if (journal_fd >= 0 && connect(journal_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(journal_fd);
    journal_fd = -1;
  }
}

void journal_entry(int stream, const char* line, size_t n) {
  // MESSAGE in the binary-safe form (it may hold any byte but the newline it ended at).
  char head[] = "MESSAGE\n";
  uint64_t len = n;
  char lenbuf[8];
  for (int i = 0; i < 8; ++i) lenbuf[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  const char* prio =
      stream == 0 ? "\nPRIORITY=6\nWEFT_STREAM=stdout\n" : "\nPRIORITY=3\nWEFT_STREAM=stderr\n";
  iovec v[5] = {{head, sizeof head - 1},
                {lenbuf, 8},
                {const_cast<char*>(line), n},
                {const_cast<char*>(prio), strlen(prio)},
                {journal_fields, journal_fields_len}};
  msghdr m{};
  m.msg_iov = v;
  m.msg_iovlen = 5;
  (void)sendmsg(journal_fd, &m, MSG_NOSIGNAL);
}

void journal_write(int stream, const char* data, size_t n) {
  if (journal_fd < 0) return;
  char* part = journal_part[stream];
  size_t& len = journal_len[stream];
  while (n > 0) {
    const char* nl = static_cast<const char*>(memchr(data, '\n', n));
    size_t take = nl ? static_cast<size_t>(nl - data) : n;
    if (len + take >= kJournalLine) {  // a line this long goes in pieces
      size_t room = kJournalLine - len;
      memcpy(part + len, data, room);
      journal_entry(stream, part, kJournalLine);
      len = 0;
      data += room;
      n -= room;
      continue;
    }
    memcpy(part + len, data, take);
    len += take;
    if (!nl) return;
    journal_entry(stream, part, len);
    len = 0;
    data += take + 1;
    n -= take + 1;
  }
}

// Appends "weft-init: msg" to the task's stderr log so operators see setup failures.
void init_say(const char* msg) {
  char buf[700];
  int n = snprintf(buf, sizeof buf, "weft-init: %s\n", msg);
  if (log_dir_fd >= 0) log_write(&streams[1], buf, static_cast<size_t>(n));
}

// Returns false at EOF.
bool drain(LogStream* s) {
  char buf[16384];
  for (;;) {
    ssize_t n = read(s->pipe_fd, buf, sizeof buf);
    if (n > 0) {
      log_write(s, buf, static_cast<size_t>(n));
      journal_write(s == &streams[0] ? 0 : 1, buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    return false;
  }
}

// ---- namespace setup ----

int bind_dev(const char* dev, const char* target_dir) {
  char target[1024];
  snprintf(target, sizeof target, "%s/%s", target_dir, dev);
  int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd >= 0) close(fd);
  char src[64];
  snprintf(src, sizeof src, "/dev/%s", dev);
  return mount(src, target, nullptr, MS_BIND, nullptr);
}

// Kernel interfaces a task must not write or read even as root (the OCI runtimes'
// masked and read-only paths): /proc/sys and friends become read-only, the rest are
// covered by an empty read-only file. `proc` is where the task's /proc is mounted.
bool harden_proc(const char* proc) {
  const char* readonly[] = {"sys", "sysrq-trigger", "irq", "bus", "fs"};
  char path[600];
  for (const char* r : readonly) {
    snprintf(path, sizeof path, "%s/%s", proc, r);
    if (mount(path, path, nullptr, MS_BIND | MS_REC, nullptr) < 0) {
      if (errno == ENOENT) continue;
      return note_setup_error("protect /proc"), false;
    }
    if (mount(nullptr, path, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
              nullptr) < 0)
      return note_setup_error("make /proc read-only"), false;
  }
  const char* masked[] = {"kcore", "keys", "timer_list", "sched_debug", "kallsyms", "kmsg"};
  for (const char* m : masked) {
    snprintf(path, sizeof path, "%s/%s", proc, m);
    if (access(path, F_OK) != 0) continue;
    if (mount("/dev/null", path, nullptr, MS_BIND, nullptr) < 0)
      return note_setup_error("mask /proc file"), false;
  }
  return true;
}

// Recursively read-only (every submount too, e.g. the cgroup trees under /sys).
bool bind_readonly_recursive(const char* path) {
  if (mount(path, path, nullptr, MS_BIND | MS_REC, nullptr) < 0)
    return note_setup_error("bind read-only"), false;
  struct {
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
  } attr = {0x1 /* MOUNT_ATTR_RDONLY */, 0, 0, 0};
  if (syscall(442 /* mount_setattr */, -1, path, 0x8000 /* AT_RECURSIVE */, &attr, sizeof attr) <
      0) {
    // Older kernels: the top mount at least.
    if (mount(nullptr, path, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) < 0)
      return note_setup_error("make read-only"), false;
  }
  return true;
}

bool mount_overlay() {
  // The lower directories are named relative to the layer store (short names: the
  // mount options fit in a page for dozens of layers).
  char data[4096];
  int n = snprintf(data, sizeof data, "lowerdir=%s,upperdir=%s,workdir=%s", opt.overlay_lower,
                   opt.overlay_upper, opt.overlay_work);
  if (n < 0 || n >= static_cast<int>(sizeof data)) {
    errno = E2BIG;
    return note_setup_error("overlay options"), false;
  }
  if (chdir(opt.overlay_layers) < 0) return note_setup_error("chdir to the layers"), false;
  // nosuid: a setuid file of the image grants nothing; nodev: no device node works.
  if (mount("overlay", opt.rootfs, "overlay", MS_NOSUID | MS_NODEV, data) < 0)
    return note_setup_error("mount the image's overlay"), false;
  return true;
}

// ---- mounts beside an own root ----

// A path inside the task's root (after pivot_root), walked one component at a time
// without following any symlink: a hostile image cannot point a mount target at
// /proc or anywhere else. Missing directories are made; the last component is made a
// directory or an empty file. Returns an O_PATH descriptor, or -1.
int open_target(const char* path, bool dir) {
  int cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cur < 0) return -1;
  char buf[1100];
  snprintf(buf, sizeof buf, "%s", path);
  char* save = nullptr;
  char* part = strtok_r(buf, "/", &save);
  while (part) {
    char* next = strtok_r(nullptr, "/", &save);
    bool last = next == nullptr;
    int fd;
    if (!last || dir) {
      fd = openat(cur, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) {
        // The parent was opened O_PATH: mkdirat needs a real directory descriptor.
        int real = openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (real >= 0) {
          mkdirat(real, part, 0755);
          close(real);
        }
        fd = openat(cur, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
    } else {
      int real = openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (real >= 0) {
        int f = openat(real, part, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        if (f >= 0) close(f);
        close(real);
      }
      fd = openat(cur, part, O_PATH | O_NOFOLLOW | O_CLOEXEC);
      struct stat st;
      if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
        errno = ENOTDIR;
      }
    }
    close(cur);
    if (fd < 0) return -1;
    cur = fd;
    part = next;
  }
  return cur;
}

int set_mount_attr(int fd, unsigned long long set, bool recursive) {
  struct {
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
  } attr = {set, 0, 0, 0};
  return static_cast<int>(syscall(442 /* mount_setattr */, fd, "",
                                  AT_EMPTY_PATH | (recursive ? 0x8000 /* AT_RECURSIVE */ : 0),
                                  &attr, sizeof attr));
}

struct Prepared {
  int fd;
  const char* target;
  bool dir;
};
Prepared prepared[64];
int nprepared = 0;

// Before pivot_root: host directories as detached trees, tmpfs as new detached mounts.
bool prepare_mounts() {
  for (int i = 0; i < opt.nbinds; ++i) {
    const char* v = opt.binds[i];
    bool ro = strncmp(v, "ro:", 3) == 0;
    const char* src = v + 3;
    const char* colon = strchr(src, ':');
    if (!colon || (!ro && strncmp(v, "rw:", 3) != 0)) {
      errno = EINVAL;
      return note_setup_error("bind argument"), false;
    }
    char path[1100];
    snprintf(path, sizeof path, "%.*s", static_cast<int>(colon - src), src);
    // The agent checked this path against the machine's allow-list: no symlink may
    // take it elsewhere since.
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int sfd = static_cast<int>(syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how));
    if (sfd < 0) return note_setup_error("open a bind mount's source"), false;
    struct stat st;
    bool is_dir = fstat(sfd, &st) == 0 && S_ISDIR(st.st_mode);
    int tree =
        open_tree(sfd, "", AT_EMPTY_PATH | OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    close(sfd);
    if (tree < 0) return note_setup_error("clone a bind mount's source"), false;
    if (set_mount_attr(tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (ro ? MOUNT_ATTR_RDONLY : 0),
                       true) < 0)
      return note_setup_error("bind mount attributes"), false;
    prepared[nprepared++] = {tree, colon + 1, is_dir};
  }
  for (int i = 0; i < opt.ntmpfs; ++i) {
    char buf[1200];
    snprintf(buf, sizeof buf, "%s", opt.tmpfs[i]);
    char* size = buf;
    char* mode = strchr(size, ':');
    char* rw = mode ? strchr(mode + 1, ':') : nullptr;
    char* target = rw ? strchr(rw + 1, ':') : nullptr;
    if (!target) {
      errno = EINVAL;
      return note_setup_error("tmpfs argument"), false;
    }
    *mode++ = 0;
    *rw++ = 0;
    *target++ = 0;
    int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "size", size, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "mode", mode, 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
      return note_setup_error("make a tmpfs"), false;
    int m = fsmount(
        fs, FSMOUNT_CLOEXEC,
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (strcmp(rw, "ro") == 0 ? MOUNT_ATTR_RDONLY : 0));
    close(fs);
    if (m < 0) return note_setup_error("mount a tmpfs"), false;
    prepared[nprepared++] = {m, opt.tmpfs[i] + (target - buf), true};
  }
  return true;
}

// After pivot_root: each prepared mount onto its target; then the files, from a tmpfs
// of their own (written here, owned by the task's user, then made read-only).
bool attach_mounts() {
  for (int i = 0; i < nprepared; ++i) {
    int t = open_target(prepared[i].target, prepared[i].dir);
    if (t < 0) return note_setup_error("make a mount target (symlinks are refused)"), false;
    int r =
        move_mount(prepared[i].fd, "", t, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
    close(t);
    close(prepared[i].fd);
    if (r < 0) return note_setup_error("attach a mount"), false;
  }
  if (opt.nfiles == 0) return true;
  const char* stage = "/.weft-files";
  mkdir(stage, 0700);
  if (mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,size=8m") < 0)
    return note_setup_error("mount the files' tmpfs"), false;
  bool ok = true;
  for (int i = 0; i < opt.nfiles && ok; ++i) {
    char* end = nullptr;
    unsigned long mode = strtoul(opt.files[i], &end, 8);
    unsigned long long len = end && *end == ':' ? strtoull(end + 1, &end, 10) : 0;
    const char* target = end && *end == ':' ? end + 1 : nullptr;
    if (!target || len > (1u << 20)) {
      errno = EINVAL;
      note_setup_error("file argument");
      ok = false;
      break;
    }
    char name[64];
    snprintf(name, sizeof name, "%s/f%d", stage, i);
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      ok = false;
      note_setup_error("write a file");
      break;
    }
    char buf[65536];
    while (len > 0 && ok) {
      ssize_t n = read(4, buf, len < sizeof buf ? len : sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || write(fd, buf, static_cast<size_t>(n)) != n) {
        if (n == 0) errno = EIO;
        ok = false;
        note_setup_error("copy a file's content");
        break;
      }
      len -= static_cast<unsigned long long>(n);
    }
    uid_t u = opt.uid >= 0 ? static_cast<uid_t>(opt.uid) : getuid();
    gid_t g = opt.gid >= 0 ? static_cast<gid_t>(opt.gid) : getgid();
    if (ok && (fchown(fd, u, g) < 0 || fchmod(fd, static_cast<mode_t>(mode & 0777)) < 0)) {
      ok = false;
      note_setup_error("set a file's owner and mode");
    }
    close(fd);
    if (!ok) break;
    int t = open_target(target, false);
    if (t < 0) {
      ok = false;
      note_setup_error("make a file's mount point (symlinks are refused)");
      break;
    }
    int tree = open_tree(AT_FDCWD, name, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0 ||
        set_mount_attr(tree,
                       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                       false) < 0 ||
        move_mount(tree, "", t, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
      ok = false;
      note_setup_error("mount a file");
    }
    if (tree >= 0) close(tree);
    close(t);
  }
  umount2(stage, MNT_DETACH);
  rmdir(stage);
  close(4);
  return ok;
}

bool setup_rootfs() {
  const char* root = opt.rootfs;
  if (opt.overlay_lower && !mount_overlay()) return false;
  if (mount(root, root, nullptr, MS_BIND | MS_REC, nullptr) < 0)
    return note_setup_error("bind rootfs"), false;
  char path[512];
  snprintf(path, sizeof path, "%s/proc", root);
  mkdir(path, 0555);
  if (mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    return note_setup_error("mount /proc"), false;
  if (!harden_proc(path)) return false;
  snprintf(path, sizeof path, "%s/dev", root);
  mkdir(path, 0755);
  if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k") < 0)
    return note_setup_error("mount /dev"), false;
  const char* devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
  for (const char* d : devs) {
    if (bind_dev(d, path) < 0) return note_setup_error("bind /dev node"), false;
  }
  char sub[600];
  snprintf(sub, sizeof sub, "%s/pts", path);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/shm", path);
  mkdir(sub, 01777);
  mount("shm", sub, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=65536k");
  const char* links[][2] = {{"/proc/self/fd", "fd"},
                            {"/proc/self/fd/0", "stdin"},
                            {"/proc/self/fd/1", "stdout"},
                            {"/proc/self/fd/2", "stderr"}};
  for (auto& l : links) {
    snprintf(sub, sizeof sub, "%s/%s", path, l[1]);
    if (symlink(l[0], sub) < 0 && errno != EEXIST) {
    }
  }
  if (!prepare_mounts()) return false;
  if (chdir(root) < 0) return note_setup_error("chdir rootfs"), false;
  if (syscall(SYS_pivot_root, ".", ".") < 0) return note_setup_error("pivot_root"), false;
  if (umount2(".", MNT_DETACH) < 0) return note_setup_error("detach old root"), false;
  if (chdir("/") < 0) return note_setup_error("chdir /"), false;
  return attach_mounts();
}

bool bring_lo_up() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strcpy(ifr.ifr_name, "lo");
  if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0) return note_setup_error("get lo flags"), false;
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) return note_setup_error("bring lo up"), false;
  close(s);
  return true;
}

bool setup_namespaces() {
  if (opt.rootfs || opt.mount_proc) {
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
      return note_setup_error("make mounts private"), false;
  }
  if (opt.rootfs) {
    if (!setup_rootfs()) return false;
  } else {
    if (opt.mount_proc) {
      if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
        return note_setup_error("mount /proc"), false;
    }
    if (opt.private_mounts) {
      // The host's root is the task's root here: its /sys and /proc/sys at least are
      // not the task's to change.
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
        return note_setup_error("make mounts private"), false;
      if (!bind_readonly_recursive("/sys") || !harden_proc("/proc")) return false;
    }
  }
  if (opt.hostname && sethostname(opt.hostname, strlen(opt.hostname)) < 0)
    return note_setup_error("sethostname"), false;
  if (opt.lo_up && !bring_lo_up()) return false;
  return true;
}

// ---- main process ----

[[noreturn]] void exec_main(int out_w, int err_w, int status_w) {
  // The task starts with default signal handling whatever the agent inherited.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(out_w, 1);
  dup2(err_w, 2);
  // No descriptor of weft-init's reaches the task: the status pipe moves to fd 3
  // (close-on-exec, replacing the task directory) and everything above it is closed.
  // An inherited directory fd is a way out of any rootfs (runc CVE-2024-21626).
  if (dup3(status_w, 3, O_CLOEXEC) < 0) _exit(127);
  status_w = 3;
  syscall(SYS_close_range, 4u, ~0u, 0u);
  weft_init::Confinement conf;
  conf.seccomp = opt.seccomp;
  conf.as_root = opt.uid >= 0 ? opt.uid == 0 : getuid() == 0;
  // Reports {stage, errno} to weft-init when something fails before exec.
  int report[2] = {0, 0};
  int cerr = 0;
  if ((opt.ngroups >= 0 && setgroups(static_cast<size_t>(opt.ngroups), opt.groups) < 0) ||
      (opt.gid >= 0 && setgid(static_cast<gid_t>(opt.gid)) < 0) ||
      (errno = weft_init::drop_bounding_set(conf)) != 0 ||
      (opt.uid >= 0 && setuid(static_cast<uid_t>(opt.uid)) < 0)) {
    report[0] = kStageCredentials;
  } else if (chdir(opt.cwd) < 0) {
    report[0] = kStageChdir;
  } else if ((cerr = weft_init::confine_after_credentials(conf)) != 0) {
    errno = cerr;
    report[0] = kStageConfine;
  } else {
    opt.env[opt.nenv] = nullptr;
    execvpe(opt.argv[0], opt.argv, opt.env);
    report[0] = kStageExec;
  }
  report[1] = errno;
  ssize_t w = write(status_w, report, sizeof report);
  (void)w;
  _exit(127);
}

int start_main(void* fds) {
  const int* f = static_cast<const int*>(fds);
  exec_main(f[0], f[1], f[2]);
}

// ---- --join-pid: a command inside a running task (readiness checks) ----
//
// Started by the agent inside the task's cgroup, with the pidfd of the task's weft-init
// as fd 3. Enters the task's mount, pid, network, UTS and IPC namespaces and its root,
// then forks the command (in the task's pid namespace) with the task's credentials and
// confinement, the same steps as the task's own main process; exits with its status.
// Killed (the agent's timeout), it takes the command with it (parent-death signal).
[[noreturn]] void exec_joined(int parent_alive) {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  }
  weft_init::Confinement conf;
  conf.seccomp = opt.seccomp;
  conf.as_root = opt.uid >= 0 ? opt.uid == 0 : getuid() == 0;
  if ((opt.ngroups >= 0 && setgroups(static_cast<size_t>(opt.ngroups), opt.groups) < 0) ||
      (opt.gid >= 0 && setgid(static_cast<gid_t>(opt.gid)) < 0) ||
      weft_init::drop_bounding_set(conf) != 0 ||
      (opt.uid >= 0 && setuid(static_cast<uid_t>(opt.uid)) < 0))
    _exit(126);
  // After the credential change (which clears it): dies with its parent. The parent is
  // outside this pid namespace (getppid() says 0): a pipe whose other end only it holds
  // tells whether it still lives.
  // A terminal (task exec --tty): a session of its own with it as the controlling one,
  // so that ^C on the caller's keyboard reaches the command's foreground group.
  if (opt.tty && (setsid() < 0 || ioctl(0, TIOCSCTTY, 0) < 0)) _exit(126);
  struct pollfd alive = {parent_alive, POLLIN, 0};
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || poll(&alive, 1, 0) != 0) _exit(126);
  close(parent_alive);
  if (chdir(opt.cwd) < 0 || weft_init::confine_after_credentials(conf) != 0) _exit(126);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  opt.env[opt.nenv] = nullptr;
  // A name without a slash is looked up in the task's PATH (`weftctl task exec ID -- sh`).
  environ = opt.env;
  execvp(opt.argv[0], opt.argv);
  _exit(127);
}

int run_joined() {
  prctl(PR_SET_DUMPABLE, 0);  // root in the task's namespaces: nothing may ptrace it
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/root", opt.join_pid);
  // The task's root, opened before entering its mount namespace (as nsenter does), and
  // the pidfd checked after: the pid was not reused in between.
  int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0 || syscall(SYS_pidfd_send_signal, 3, 0, nullptr, 0) < 0) return 125;
  if (setns(3, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC) < 0)
    return 125;
  close(3);
  if (fchdir(root) < 0 || chroot(".") < 0 || chdir("/") < 0) return 125;
  close(root);
  syscall(SYS_close_range, 3u, ~0u, 0u);
  int alive[2];
  if (pipe2(alive, O_CLOEXEC) < 0) return 125;
  pid_t child = fork();  // in the task's pid namespace
  if (child < 0) return 125;
  if (child == 0) {
    close(alive[1]);
    exec_joined(alive[0]);
  }
  close(alive[0]);  // alive[1] stays open until this process ends
  for (;;) {
    int status;
    pid_t r = waitpid(child, &status, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return 125;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
  }
}

// A sandbox: waits on fd 3 for the task (agent/init/handoff.h), then puts its task
// directory on fd 3 and its files on fd 4 and returns the argv it was handed. Null when
// the agent went away first (end of file) or sent something else: weft-init then exits
// without touching anything, as it holds nothing yet.
char** await_task(int* argc) {
  using namespace weft::handoff;
  Header h;
  int fds[kMaxFds] = {-1, -1};
  int nfds = 0;
  size_t got = 0;
  while (got < sizeof h) {
    struct iovec iov = {reinterpret_cast<char*>(&h) + got, sizeof h - got};
    alignas(struct cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)];
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t n = recvmsg(3, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || (m.msg_flags & MSG_CTRUNC)) return nullptr;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      if (nfds != 0 || count > static_cast<size_t>(kMaxFds)) return nullptr;
      memcpy(fds, CMSG_DATA(c), count * sizeof(int));
      nfds = static_cast<int>(count);
    }
    got += static_cast<size_t>(n);
  }
  if (!header_ok(h) || static_cast<uint32_t>(nfds) != h.nfds) return nullptr;
  char* body = static_cast<char*>(malloc(h.body_len));
  char** args = static_cast<char**>(calloc(h.argc + 1, sizeof(char*)));
  if (!body || !args) return nullptr;
  for (got = 0; got < h.body_len;) {
    ssize_t n = read(3, body + got, h.body_len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return nullptr;
    got += static_cast<size_t>(n);
  }
  if (!split_args(body, h.body_len, h.argc, args)) return nullptr;
  // The socket's end goes: fd 3 is the task directory from now on, as when started
  // with it.
  int task_dir = fds[0], files = nfds > 1 ? fds[1] : -1;
  if (dup2(task_dir, 3) < 0) return nullptr;
  close(task_dir);
  if (files >= 0 && files != 4) {
    if (dup2(files, 4) < 0) return nullptr;
    close(files);
  }
  *argc = static_cast<int>(h.argc);
  return args;
}

// The main process's exec, as its status pipe tells it: 0 when it ran the task's
// program (the pipe closed on exec), else the errno of the stage that failed, said in the
// task's log.
int await_exec(int status_r) {
  int report[2] = {0, 0};
  ssize_t got = read(status_r, report, sizeof report);
  close(status_r);
  int exec_errno = got == sizeof report ? report[1] : 0;
  if (exec_errno) {
    exec_stage = report[0];
    char msg[600];
    if (exec_stage == kStageChdir)
      snprintf(msg, sizeof msg, "cannot change to %s: %s", opt.cwd, strerror(exec_errno));
    else if (exec_stage == kStageCredentials)
      snprintf(msg, sizeof msg, "cannot switch user/group: %s", strerror(exec_errno));
    else if (exec_stage == kStageConfine)
      snprintf(msg, sizeof msg, "cannot confine the task (capabilities, seccomp): %s",
               strerror(exec_errno));
    else
      snprintf(msg, sizeof msg, "cannot execute %s: %s", opt.argv[0], strerror(exec_errno));
    init_say(msg);
  }
  return exec_errno;
}

// weft-init's life while the task runs: its output to the logs, signals forwarded to the
// main process, orphans reaped; when the main process ends, its exit record, and its
// status as weft-init's own.
int supervise(int sfd, pid_t main_pid, int out_r, int err_r, int exec_errno) {
  streams[0].pipe_fd = out_r;
  streams[1].pipe_fd = err_r;
  fcntl(out_r, F_SETFL, O_NONBLOCK);
  fcntl(err_r, F_SETFL, O_NONBLOCK);

  bool open_stream[2] = {true, true};
  for (;;) {
    struct pollfd p[3] = {{sfd, POLLIN, 0},
                          {open_stream[0] ? out_r : -1, POLLIN, 0},
                          {open_stream[1] ? err_r : -1, POLLIN, 0}};
    if (poll(p, 3, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (open_stream[i] && (p[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
        open_stream[i] = drain(&streams[i]);
    }
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == sizeof si) {
      if (si.ssi_signo == SIGCHLD) continue;
      // Forward everything else to the main process (SIGKILL/SIGSTOP never get here).
      kill(main_pid, static_cast<int>(si.ssi_signo));
    }
    for (;;) {
      int status;
      pid_t r = waitpid(-1, &status, WNOHANG);
      if (r <= 0) break;
      if (r != main_pid) continue;  // an orphan we adopted: just reaped
      for (int i = 0; i < 2; ++i)
        if (open_stream[i]) drain(&streams[i]);
      write_exit_record(true, status, exec_errno);
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
  }
  write_exit_record(false, 0, 0);
  return 125;
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc == 2 || (argc == 3 && !strcmp(argv[2], "--lo"))) && !strcmp(argv[1], "--await-task")) {
    // Nothing of the host's may be read through this process while it waits either.
    prctl(PR_SET_DUMPABLE, 0);
    // A network namespace of its own: its loopback comes up now, not on the task's start.
    if (argc == 3 && !bring_lo_up()) return 125;
    argv = await_task(&argc);
    if (!argv) return 125;
    // Only a task's own start is handed off: no second wait, no join.
    if (argc > 1 && (!strcmp(argv[1], "--await-task") || !strcmp(argv[1], "--join-pid")))
      return 125;
  }
  if (opt.join_pid == -1 && argc > 2 && !strcmp(argv[1], "--join-pid")) {
    if (!weft_init::parse_args(argc, argv, &opt) || opt.join_pid <= 0 || fcntl(3, F_GETFD) < 0 ||
        opt.argv[0][0] == '\0') {
      fprintf(stderr, "weft-init: bad arguments (this program is started by weft-agent)\n");
      return 125;
    }
    return run_joined();
  }
  if (!weft_init::parse_args(argc, argv, &opt) || opt.task_dir_fd < 0 ||
      fcntl(opt.task_dir_fd, F_GETFD) < 0 ||
      (opt.overlay_lower &&
       !(opt.overlay_layers && opt.overlay_upper && opt.overlay_work && opt.rootfs))) {
    fprintf(stderr, "weft-init: bad arguments (this program is started by weft-agent)\n");
    return 125;
  }
  setsid();
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // weft-init holds the task's host directory for its logs and exit record: not
  // dumpable, so no process of the task (even root, without CAP_SYS_PTRACE) can open
  // /proc/1/fd/N or ptrace it.
  prctl(PR_SET_DUMPABLE, 0);  // matters when there is no pid namespace
  if (opt.log_max_files < 1) opt.log_max_files = 1;

  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, nullptr);
  int sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);

  mkdirat(opt.task_dir_fd, "logs", 0750);
  log_dir_fd = openat(opt.task_dir_fd, "logs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  journal_open();  // before the task's mounts: the socket is the host's

  if (!setup_namespaces()) {
    init_say(setup_error);
    write_exit_record(false, 0, 0);
    return 125;
  }

  int out_p[2], err_p[2], st_p[2];
  if (pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0 || pipe2(st_p, O_CLOEXEC) < 0) {
    note_setup_error("pipe");
    init_say(setup_error);
    write_exit_record(false, 0, 0);
    return 125;
  }
  // The main process shares weft-init's memory until its exec (as posix_spawn does): no
  // page tables to copy, which on a paravirtualised machine is most of a fork's cost
  // (0.9 ms -> 0.04 ms here). weft-init waits meanwhile (CLONE_VFORK); the child runs on
  // a stack of its own and changes nothing of weft-init's but descriptors it inherits
  // (its own table) and errno.
  static char child_stack[64 * 1024] __attribute__((aligned(16)));
  int child_fds[3] = {out_p[1], err_p[1], st_p[1]};
  pid_t main_pid = clone(start_main, child_stack + sizeof child_stack,
                         CLONE_VM | CLONE_VFORK | SIGCHLD, child_fds);
  if (main_pid < 0) {
    note_setup_error("fork");
    init_say(setup_error);
    write_exit_record(false, 0, 0);
    return 125;
  }
  close(out_p[1]);
  close(err_p[1]);
  close(st_p[1]);
  int exec_errno = await_exec(st_p[0]);
  return supervise(sfd, main_pid, out_p[0], err_p[0], exec_errno);
}
