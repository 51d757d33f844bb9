// HostPaths: the one door to the host's /proc, /sys and cgroup2 tree.
//
// Every path into the kernel's pseudo-filesystems is built here from a root that
// defaults to "/". Tests point the root at a fake tree in a temp dir and exercise the
// same code as production. Cheap to copy; no I/O except cgroup2_mount().
#pragma once

#include <string>

#include "common/result.h"

namespace weft {

class HostPaths {
 public:
  explicit HostPaths(std::string root = "/");

  const std::string& root() const { return root_; }
  std::string proc(const std::string& rel = "") const { return join("proc", rel); }
  std::string sys(const std::string& rel = "") const { return join("sys", rel); }
  std::string etc(const std::string& rel = "") const { return join("etc", rel); }

  // Where cgroup2 is mounted, from <root>/proc/self/mountinfo: /sys/fs/cgroup on a
  // unified system, /sys/fs/cgroup/unified on a hybrid one. The result is prefixed by
  // root. Fails when there is no cgroup2 mount.
  Result<std::string> cgroup2_mount() const;
  // This process's cgroup2 path relative to the cgroup2 mount ("/system.slice/x").
  Result<std::string> own_cgroup() const;

 private:
  std::string join(const char* top, const std::string& rel) const;
  std::string root_;
};

}  // namespace weft
