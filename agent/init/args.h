// weft-init's command line: what the agent asks of it (agent/init/argv.h builds it) and
// the parser weft-init reads it with. Both live here, beside each other, so the two ends
// of the contract change together; init/argv_test.cc round-trips one through the other.
//
// Plain C-style C++ (no libstdc++): weft-init is static and tiny.
#pragma once

#include <sys/types.h>

namespace weft_init {

struct Args {
  int task_dir_fd = -1;
  unsigned long incarnation = 0;
  long uid = -1, gid = -1;
  gid_t groups[64];
  int ngroups = -1;
  const char* cwd = "/";
  const char* hostname = nullptr;
  const char* rootfs = nullptr;
  // An image root: an overlayfs of these layers (relative to overlay_layers, top-most
  // first, ':'-separated) with the task's own upper and work directories, mounted on
  // `rootfs` (an empty directory) inside the task's mount namespace.
  const char* overlay_layers = nullptr;
  const char* overlay_lower = nullptr;
  const char* overlay_upper = nullptr;
  const char* overlay_work = nullptr;
  // Mounts beside an own root, in order: "--bind ro|rw:SRC:DST", "--tmpfs
  // SIZE:MODE:ro|rw:DST", "--file MODE:LEN:DST" (contents on fd 4, in order).
  const char* binds[33];  // the spec's 32, and a package's
  int nbinds = 0;
  const char* tmpfs[32];
  int ntmpfs = 0;
  const char* files[64];
  int nfiles = 0;
  bool mount_proc = false;
  bool private_mounts = false;  // a mount namespace of its own: /sys and /proc/sys go read-only
  bool seccomp = true;
  bool lo_up = false;
  unsigned long long log_max_bytes = 10ull << 20;
  unsigned log_max_files = 5;
  // Output copied to journald too, one entry per line, with these fields ("KEY=VALUE":
  // WEFT_TASK, WEFT_JOB, WEFT_ENTITLEMENT, ...; none: no copy). The first names the task.
  const char* journal_fields[8];
  int njournal = 0;
  const char* journal_socket = "/run/systemd/journal/socket";
  char* env[1024];  // null-terminated by the parser
  int nenv = 0;
  char** argv = nullptr;  // the program and its arguments: what follows "--"
  long join_pid = -1;     // --join-pid: run argv inside that task (fd 3: its pidfd)
  // --tty (with --join-pid): stdin is a terminal the command takes as its controlling one
  // in a session of its own (`weftctl task exec --tty`).
  bool tty = false;
};

// Parses argv[1..argc) into *out. False on an unknown option, an option without its
// value, a list past its bound, or no program after "--".
bool parse_args(int argc, char** argv, Args* out);

}  // namespace weft_init
