/* escape_probe: run as a weft task, it tries the known ways out of a container and
 * prints one line per route, "<route>: blocked" or "<route>: ESCAPED <detail>". The
 * hostile-task suite (tests/hostile_root_test.cc) expects every line to say blocked.
 * Static, so it runs in a busybox rootfs. argv[1]: a host path that must not be
 * visible from inside (the agent's state directory). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static int escaped = 0;

static void result(const char* route, int ok_blocked, const char* detail) {
  if (ok_blocked) {
    printf("%s: blocked\n", route);
  } else {
    printf("%s: ESCAPED %s\n", route, detail ? detail : "");
    escaped = 1;
  }
}

static void inherited_fds(void) {
  char detail[256] = "";
  int open_fds = 0;
  for (int fd = 3; fd < 4096; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) continue;
    char link[64], target[200] = "";
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) target[n] = 0;
    snprintf(detail, sizeof detail, "fd %d -> %s", fd, target);
    ++open_fds;
  }
  result("inherited-fd", open_fds == 0, detail);
  int up = openat(3, "../../..", O_RDONLY | O_DIRECTORY);
  result("openat-fd3-dotdot", up < 0, "opened ../../.. through fd 3");
}

static void proc_of_init(void) {
  char path[64];
  int any = 0;
  for (int fd = 0; fd < 16; ++fd) {
    snprintf(path, sizeof path, "/proc/1/fd/%d", fd);
    int f = open(path, O_RDONLY);
    if (f >= 0) {
      any = 1;
      close(f);
    }
  }
  result("proc-1-fd", !any, "opened a descriptor of pid 1 through /proc/1/fd");
  int w = open("/proc/1/exe", O_WRONLY);
  result("proc-1-exe-write", w < 0, "/proc/1/exe opened for writing");
  int s = open("/proc/self/exe", O_WRONLY);
  result("proc-self-exe-write", s < 0, "/proc/self/exe opened for writing");
  int mem = open("/proc/1/mem", O_RDWR);
  result("proc-1-mem", mem < 0, "/proc/1/mem opened");
  int root = open("/proc/1/root/proc/1/fd/3", O_RDONLY);
  result("proc-1-root", root < 0, "/proc/1/root/.../fd/3 opened");
}

static void host_path(const char* marker) {
  if (!marker) return;
  struct stat st;
  result("host-path-visible", stat(marker, &st) < 0, marker);
  /* The classic chroot breakout: chroot into a subdirectory, climb, chroot "." again. */
  mkdir("/tmp", 01777);
  mkdir("/tmp/.breakout", 0700);
  int ok = 1;
  if (chroot("/tmp/.breakout") == 0) {
    for (int i = 0; i < 64; ++i) (void)!chdir("..");
    if (chroot(".") == 0 && stat(marker, &st) == 0) ok = 0;
  }
  result("chroot-breakout", ok, marker);
}

static void kernel_interfaces(void) {
  result("mount-tmpfs", mount("tmpfs", "/tmp", "tmpfs", 0, NULL) < 0, "mounted a tmpfs");
  result("mount-cgroup2",
         mount("none", "/mnt", "cgroup2", 0, NULL) < 0 &&
             mount("none", "/tmp", "cgroup2", 0, NULL) < 0,
         "mounted cgroup2");
  result("unshare-user", unshare(CLONE_NEWUSER) < 0, "new user namespace");
  result("unshare-mount", unshare(CLONE_NEWNS) < 0, "new mount namespace");
  int ns = open("/proc/1/ns/mnt", O_RDONLY);
  result("setns", ns < 0 || setns(ns, 0) < 0, "entered pid 1's mount namespace");
  result("ptrace-init", ptrace(PTRACE_ATTACH, 1, 0, 0) < 0, "attached to pid 1");
  result("mknod-block", mknod("/tmp/.sda", S_IFBLK | 0600, makedev(8, 0)) < 0,
         "made a block device node");
  unlink("/tmp/.sda");
  int sys = open("/proc/sys/kernel/domainname", O_WRONLY);
  result("proc-sys-write", sys < 0, "/proc/sys writable");
  int rq = open("/proc/sysrq-trigger", O_WRONLY);
  result("sysrq-trigger", rq < 0, "/proc/sysrq-trigger writable");
  int kc = open("/proc/kcore", O_RDONLY);
  char b;
  result("proc-kcore", kc < 0 || read(kc, &b, 1) <= 0, "/proc/kcore readable");
  /* The task's own cgroup, from /proc/self/cgroup, under any cgroup2 mount it can see. */
  int cg_writable = 0;
  const char* mounts[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
  char rel[640] = "";
  FILE* f = fopen("/proc/self/cgroup", "r");
  if (f) {
    char line[600];
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "0::", 3)) {
        snprintf(rel, sizeof rel, "%s", line + 3);
        rel[strcspn(rel, "\n")] = 0;
      }
    fclose(f);
  }
  for (int i = 0; i < 2; ++i) {
    char p[1400];
    snprintf(p, sizeof p, "%s%s/../cgroup.procs", mounts[i], rel);
    int c = open(p, O_WRONLY);
    if (c >= 0) cg_writable = 1;
    snprintf(p, sizeof p, "%s/cgroup.procs", mounts[i]);
    c = open(p, O_WRONLY);
    if (c >= 0) cg_writable = 1;
  }
  result("cgroup-write", !cg_writable, "a cgroup.procs outside the task is writable");
  union bpf_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.map_type = BPF_MAP_TYPE_ARRAY;
  attr.key_size = 4;
  attr.value_size = 4;
  attr.max_entries = 1;
  result("bpf", syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr) < 0, "created a BPF map");
  struct perf_event_attr pe;
  memset(&pe, 0, sizeof pe);
  pe.size = sizeof pe;
  pe.type = PERF_TYPE_SOFTWARE;
  pe.config = PERF_COUNT_SW_CPU_CLOCK;
  result("perf_event_open", syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0) < 0,
         "opened a perf event");
  result("keyctl", syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0) < 0,
         "reached the session keyring");
  struct file_handle {
    unsigned int handle_bytes;
    int handle_type;
    unsigned char f_handle[8];
  } fh = {8, 1, {2, 0, 0, 0, 0, 0, 0, 0}};
  result("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, &fh, O_RDONLY) < 0,
         "opened an inode by handle");
}

static void privileges(void) {
  result("no_new_privs", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1, "no_new_privs not set");
  /* CAP_SYS_ADMIN (21), CAP_SYS_PTRACE (19), CAP_SYS_MODULE (16), CAP_MKNOD (27). */
  int caps[] = {21, 19, 16, 27, 25 /* SYS_TIME */, 12 /* NET_ADMIN */};
  int held = -1;
  for (unsigned i = 0; i < sizeof caps / sizeof caps[0]; ++i)
    if (prctl(PR_CAPBSET_READ, caps[i], 0, 0, 0) == 1) held = caps[i];
  char d[64];
  snprintf(d, sizeof d, "capability %d in the bounding set", held);
  result("bounding-set", held < 0, d);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  inherited_fds();
  proc_of_init();
  host_path(argc > 1 ? argv[1] : NULL);
  kernel_interfaces();
  privileges();
  printf("uid=%d done escaped=%d\n", (int)getuid(), escaped);
  return escaped;
}
