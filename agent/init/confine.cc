#include "agent/init/confine.h"

#include <errno.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "task_filter.h"  // generated: kTaskFilter

namespace weft_init {

const int kDefaultCapabilities[] = {
    CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,
    CAP_SETGID,  CAP_SETUID,       CAP_NET_BIND_SERVICE, CAP_KILL,
    CAP_SETFCAP, CAP_SETPCAP,      CAP_AUDIT_WRITE,      CAP_SYS_CHROOT,
};
const int kDefaultCapabilityCount = sizeof kDefaultCapabilities / sizeof kDefaultCapabilities[0];

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

// The task's filter was compiled when weft-init was built (gen_task_filter): building
// it with libseccomp in every task's fresh process cost about 0.4 ms of each start.
int load_seccomp() {
  struct sock_fprog prog;
  prog.len = static_cast<unsigned short>(sizeof kTaskFilter / sizeof kTaskFilter[0]);
  prog.filter = const_cast<struct sock_filter*>(kTaskFilter);
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) return errno;
  return 0;
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
