#include "agent/task_root.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>

namespace weft::agent {

TaskSpec apply_image_defaults(const TaskSpec& spec, const std::vector<std::string>& entrypoint,
                              const std::vector<std::string>& cmd,
                              const std::vector<std::string>& env, const std::string& workdir,
                              const std::string& user) {
  TaskSpec s = spec;
  if (s.argv.empty()) {
    s.argv = entrypoint;
    s.argv.insert(s.argv.end(), cmd.begin(), cmd.end());
  }
  for (const auto& kv : env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    s.env.emplace(kv.substr(0, eq), kv.substr(eq + 1));  // the spec's own win
  }
  if (s.cwd.empty() && !workdir.empty() && workdir[0] == '/') s.cwd = workdir;
  if (s.user.empty() && s.group.empty()) s.user = user;
  return s;
}

Result<std::string> allowed_bind_source(const std::string& source,
                                        const std::vector<std::string>& allowed, size_t index) {
  std::string field = "mounts[" + std::to_string(index) + "].source";
  char resolved[PATH_MAX];
  if (!::realpath(source.c_str(), resolved))
    return field_error(field, "'" + source + "': " + std::strerror(errno));
  std::string r = resolved;
  if (r.find(':') != std::string::npos) return field_error(field, "resolves to a path with ':'");
  for (const auto& a : allowed) {
    char ra[PATH_MAX];
    if (!::realpath(a.c_str(), ra)) continue;
    std::string root = ra;
    if (root == "/") continue;
    if (r == root || r.rfind(root + "/", 0) == 0) return r;
  }
  return field_error(field, "'" + source +
                                "' is not under a host path this machine allows (agent.toml: "
                                "[volumes] allowed_host_paths)");
}

Result<Fd> files_memfd(const TaskSpec& spec) {
  Fd fd(
      static_cast<int>(::syscall(SYS_memfd_create, "weft-files", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!fd.valid()) return sys_error("memfd_create");
  for (const auto& f : spec.files) {
    size_t off = 0;
    while (off < f.content.size()) {
      ssize_t w = ::write(fd.get(), f.content.data() + off, f.content.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return sys_error("write the task's files");
      off += static_cast<size_t>(w);
    }
  }
  if (::lseek(fd.get(), 0, SEEK_SET) != 0) return sys_error("lseek");
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

}  // namespace weft::agent
