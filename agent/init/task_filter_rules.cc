#include "agent/init/task_filter_rules.h"

#include <errno.h>
#include <linux/sched.h>

namespace weft_init {

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

scmp_filter_ctx make_task_filter(int* err) {
  // Calls of another ABI (i386 through int 0x80, x32) would slip past a filter written
  // for the native one: libseccomp's filter kills a foreign architecture by default.
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) {
    *err = ENOMEM;
    return nullptr;
  }
  int rc = 0;
  for (int i = 0; i < kDeniedSyscallCount && rc == 0; ++i) {
    int nr = seccomp_syscall_resolve_name(kDeniedSyscalls[i]);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
  }
  const unsigned long flags[] = {CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,   CLONE_NEWUSER,
                                 CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP};
  for (unsigned long f : flags) {
    if (rc != 0) break;
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, f, f));
  }
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc != 0) {
    seccomp_release(ctx);
    *err = rc < 0 ? -rc : rc;
    return nullptr;
  }
  return ctx;
}

}  // namespace weft_init
