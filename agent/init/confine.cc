#include "agent/init/confine.h"

#include <errno.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace weft_init {

const int kDefaultCapabilities[] = {
    CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,
    CAP_SETGID,  CAP_SETUID,       CAP_NET_BIND_SERVICE, CAP_KILL,
    CAP_SETFCAP, CAP_SETPCAP,      CAP_AUDIT_WRITE,      CAP_SYS_CHROOT,
};
const int kDefaultCapabilityCount = sizeof kDefaultCapabilities / sizeof kDefaultCapabilities[0];

// The syscalls Docker's and crun's default profiles leave out for a container without
// CAP_SYS_ADMIN and friends, as a deny list over an allow-by-default filter: kernel
// modules and kexec, mounts and namespaces, keyrings, BPF and perf, ptrace and
// cross-process memory access, clocks, swap, reboot, quotas, file handles (the
// "shocker" escape), userfaultfd, io_uring and obsolete calls.
const char* const kDeniedSyscalls[] = {
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setdomainname",
    "sethostname",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "syslog",
    "sysfs",
    "_sysctl",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vm86",
    "vm86old",
    "stime",
    "adjtimex",
    "fanotify_init",
};
const int kDeniedSyscallCount = sizeof kDeniedSyscalls / sizeof kDeniedSyscalls[0];

namespace {

bool kept(int cap, const Confinement& c) {
  if (!c.as_root) return false;
  for (int i = 0; i < kDefaultCapabilityCount; ++i)
    if (kDefaultCapabilities[i] == cap) return true;
  return false;
}

int last_cap() {
  // CAP_LAST_CAP of the running kernel may be above the headers'.
  int last = CAP_LAST_CAP;
  while (prctl(PR_CAPBSET_READ, last + 1, 0, 0, 0) >= 0) ++last;
  return last;
}

int load_seccomp() {
  // Calls of another ABI (i386 through int 0x80, x32) would slip past a filter written
  // for the native one: libseccomp's filter kills a foreign architecture by default.
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return ENOMEM;
  int rc = 0;
  for (int i = 0; i < kDeniedSyscallCount && rc == 0; ++i) {
    int nr = seccomp_syscall_resolve_name(kDeniedSyscalls[i]);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
  }
  // New namespaces through clone(2), one rule per flag (a rule compares an argument
  // once). clone3 passes its flags in memory a filter cannot read: it reports ENOSYS and
  // the C library falls back to clone.
  const unsigned long flags[] = {CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,   CLONE_NEWUSER,
                                 CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP};
  for (unsigned long f : flags) {
    if (rc != 0) break;
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, f, f));
  }
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  return rc < 0 ? -rc : rc;
}

}  // namespace

int drop_bounding_set(const Confinement& c) {
  int last = last_cap();
  for (int cap = 0; cap <= last; ++cap) {
    if (kept(cap, c)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) return errno;
  }
  return 0;
}

int confine_after_credentials(const Confinement& c) {
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) return errno;
  struct __user_cap_header_struct hdr;
  struct __user_cap_data_struct data[2];
  memset(&hdr, 0, sizeof hdr);
  memset(data, 0, sizeof data);
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  for (int i = 0; i < kDefaultCapabilityCount && c.as_root; ++i) {
    int cap = kDefaultCapabilities[i];
    data[cap / 32].effective |= 1u << (cap % 32);
    data[cap / 32].permitted |= 1u << (cap % 32);
  }
  if (syscall(SYS_capset, &hdr, data) < 0) return errno;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return errno;
  if (c.seccomp) {
    int rc = load_seccomp();
    if (rc) return rc;
  }
  return 0;
}

}  // namespace weft_init
