#include "agent/init/args.h"

#include <stdlib.h>
#include <string.h>

namespace weft_init {

bool parse_args(int argc, char** argv, Args* out) {
  Args& o = *out;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!strcmp(a, "--")) {
      o.argv = argv + i + 1;
      o.env[o.nenv] = nullptr;
      return o.argv[0] != nullptr;
    }
    if (!strcmp(a, "--proc")) {
      o.mount_proc = true;
      continue;
    }
    if (!strcmp(a, "--lo")) {
      o.lo_up = true;
      continue;
    }
    if (!strcmp(a, "--private-mounts")) {
      o.private_mounts = true;
      continue;
    }
    if (!strcmp(a, "--seccomp-unconfined")) {
      o.seccomp = false;
      continue;
    }
    if (!strcmp(a, "--tty")) {
      o.tty = true;
      continue;
    }
    if (!v) return false;
    ++i;
    if (!strcmp(a, "--task-dir-fd"))
      o.task_dir_fd = atoi(v);
    else if (!strcmp(a, "--join-pid"))
      o.join_pid = atol(v);
    else if (!strcmp(a, "--incarnation"))
      o.incarnation = strtoul(v, nullptr, 10);
    else if (!strcmp(a, "--uid"))
      o.uid = atol(v);
    else if (!strcmp(a, "--gid"))
      o.gid = atol(v);
    else if (!strcmp(a, "--groups")) {
      o.ngroups = 0;
      for (const char* p = v; *p && o.ngroups < 64;) {
        o.groups[o.ngroups++] = static_cast<gid_t>(strtoul(p, const_cast<char**>(&p), 10));
        if (*p == ',')
          ++p;
        else
          break;
      }
    } else if (!strcmp(a, "--cwd"))
      o.cwd = v;
    else if (!strcmp(a, "--hostname"))
      o.hostname = v;
    else if (!strcmp(a, "--rootfs"))
      o.rootfs = v;
    else if (!strcmp(a, "--overlay-layers"))
      o.overlay_layers = v;
    else if (!strcmp(a, "--overlay-lower"))
      o.overlay_lower = v;
    else if (!strcmp(a, "--overlay-upper"))
      o.overlay_upper = v;
    else if (!strcmp(a, "--overlay-work"))
      o.overlay_work = v;
    else if (!strcmp(a, "--bind")) {
      if (o.nbinds >= 33) return false;
      o.binds[o.nbinds++] = v;
    } else if (!strcmp(a, "--tmpfs")) {
      if (o.ntmpfs >= 32) return false;
      o.tmpfs[o.ntmpfs++] = v;
    } else if (!strcmp(a, "--file")) {
      if (o.nfiles >= 64) return false;
      o.files[o.nfiles++] = v;
    } else if (!strcmp(a, "--log-max-bytes"))
      o.log_max_bytes = strtoull(v, nullptr, 10);
    else if (!strcmp(a, "--log-max-files"))
      o.log_max_files = static_cast<unsigned>(atoi(v));
    else if (!strcmp(a, "--journal-socket"))
      o.journal_socket = v;
    else if (!strcmp(a, "--journal-field")) {
      if (o.njournal >= 8 || !strchr(v, '=')) return false;
      o.journal_fields[o.njournal++] = v;
    } else if (!strcmp(a, "--env")) {
      if (o.nenv < 1023) o.env[o.nenv++] = const_cast<char*>(v);
    } else
      return false;
  }
  return false;
}

}  // namespace weft_init
