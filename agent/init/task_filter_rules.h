// The default seccomp policy of a task: which syscalls it refuses. Compiled into a BPF
// program when weft-init is built (gen_task_filter.cc writes task_filter.h), so a
// task's start only loads it; the names are also what docs, tests and the benchmark's
// equivalent crun profile use.
#pragma once

#include <seccomp.h>

namespace weft_init {

// Syscalls the default filter refuses with EPERM (names).
extern const char* const kDeniedSyscalls[];
extern const int kDeniedSyscallCount;

// The whole filter: the denied syscalls, clone with a namespace flag (EPERM) and clone3
// (ENOSYS, so a libc falls back to clone, whose flags the filter can read). Null, with
// *err set, when libseccomp fails.
scmp_filter_ctx make_task_filter(int* err);

}  // namespace weft_init
