// What weft-init does to a task's main process between fork and exec so that an
// untrusted program cannot reach beyond its container: no inherited descriptor, a
// reduced capability set, no_new_privs, and a default seccomp filter.
//
// Plain C-style code: weft-init is static and links no libstdc++.
#pragma once

#include <sys/types.h>

namespace weft_init {

// The capabilities a task running as root keeps (the OCI runtimes' default set less
// CAP_MKNOD and CAP_NET_RAW: cgroup v2 has no device controller without BPF, so
// device nodes are refused at the capability instead). A task running as any other
// user keeps none.
extern const int kDefaultCapabilities[];
extern const int kDefaultCapabilityCount;

struct Confinement {
  bool seccomp = true;   // false: "unconfined" (allowed by the agent's configuration)
  bool as_root = false;  // the final uid is 0: keep kDefaultCapabilities
};

// Drops the bounding set to what the task keeps; call while still root, before setuid.
// Returns 0 or an errno.
int drop_bounding_set(const Confinement& c);
// After setuid: effective/permitted/inheritable to what the task keeps, ambient
// cleared, no_new_privs, then the seccomp filter (last: it refuses what came before).
int confine_after_credentials(const Confinement& c);

}  // namespace weft_init
