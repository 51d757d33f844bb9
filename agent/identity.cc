#include "agent/identity.h"

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

#include "common/strings.h"

namespace weft::agent {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

Result<Identity> resolve_identity(const std::string& user, const std::string& group) {
  Identity id;
  if (user.empty() && group.empty()) return id;
  id.set = true;
  char buf[16384];
  if (!user.empty()) {
    struct passwd pw, *res = nullptr;
    if (all_digits(user)) {
      id.uid = std::stol(user);
      if (getpwuid_r(static_cast<uid_t>(id.uid), &pw, buf, sizeof buf, &res) == 0 && res) {
        id.gid = res->pw_gid;
      } else {
        id.gid = id.uid;
      }
    } else {
      if (getpwnam_r(user.c_str(), &pw, buf, sizeof buf, &res) != 0 || !res)
        return field_error("user", "no such user '" + user + "'");
      id.uid = res->pw_uid;
      id.gid = res->pw_gid;
    }
    if (res) {
      int n = 64;
      std::vector<gid_t> g(64);
      if (getgrouplist(res->pw_name, static_cast<gid_t>(id.gid), g.data(), &n) >= 0) {
        g.resize(static_cast<size_t>(n));
        id.groups = g;
      }
    }
  }
  if (!group.empty()) {
    if (all_digits(group)) {
      id.gid = std::stol(group);
    } else {
      struct group gr, *res = nullptr;
      if (getgrnam_r(group.c_str(), &gr, buf, sizeof buf, &res) != 0 || !res)
        return field_error("group", "no such group '" + group + "'");
      id.gid = res->gr_gid;
    }
    if (user.empty()) id.uid = -1;
    id.groups = {static_cast<gid_t>(id.gid)};
  }
  if (id.groups.empty() && id.gid >= 0) id.groups = {static_cast<gid_t>(id.gid)};
  return id;
}

namespace {

// The image's copy of etc/<name>: the top-most layer that has it, read inside that
// layer (RESOLVE_IN_ROOT: a symlink in a hostile layer cannot name a host file). A
// whiteout in a higher layer hides it.
std::optional<std::string> image_file(const std::vector<std::string>& roots_top_first,
                                      const char* name) {
  for (const auto& root : roots_top_first) {
    Fd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) continue;
    std::string rel = std::string("etc/") + name;
    struct stat st {};
    if (::fstatat(dir.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISCHR(st.st_mode) &&
        st.st_rdev == 0)
      return std::nullopt;  // deleted by this layer
    struct open_how how {};
    how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    Fd f(static_cast<int>(::syscall(SYS_openat2, dir.get(), rel.c_str(), &how, sizeof how)));
    if (!f.valid()) continue;
    if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    std::string text;
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(f.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > (4u << 20)) break;  // a passwd file is not this large
    }
    return text;
  }
  return std::nullopt;
}

std::optional<long> small_id(const std::string& s) {
  if (!all_digits(s) || s.size() > 10) return std::nullopt;
  unsigned long v = std::stoul(s);
  if (v > 0xfffffffeul) return std::nullopt;
  return static_cast<long>(v);
}

}  // namespace

Result<Identity> resolve_identity_in_image(const std::string& user_spec, const std::string& group,
                                           const std::vector<std::string>& roots_top_first) {
  Identity id;
  std::string user = user_spec, grp = group;
  if (auto colon = user.find(':'); colon != std::string::npos) {  // OCI "user:group"
    if (grp.empty()) grp = user.substr(colon + 1);
    user = user.substr(0, colon);
  }
  if (user.empty() && grp.empty()) return id;
  id.set = true;
  auto passwd = image_file(roots_top_first, "passwd");
  auto groups = image_file(roots_top_first, "group");
  std::string user_name;
  if (!user.empty()) {
    auto num = small_id(user);
    bool found = false;
    if (passwd) {
      for (const auto& line : split(*passwd, '\n')) {
        auto f = split(line, ':');
        if (f.size() < 4) continue;
        auto uid = small_id(f[2]), gid = small_id(f[3]);
        if (!uid || !gid) continue;
        if ((num && *uid == *num) || (!num && f[0] == user)) {
          id.uid = *uid;
          id.gid = *gid;
          user_name = f[0];
          found = true;
          break;
        }
      }
    }
    if (!found) {
      if (!num) return field_error("user", "no user '" + user + "' in the image's /etc/passwd");
      id.uid = *num;
      id.gid = *num;
    }
  }
  if (!grp.empty()) {
    auto num = small_id(grp);
    bool found = false;
    if (num) {
      id.gid = *num;
      found = true;
    } else if (groups) {
      for (const auto& line : split(*groups, '\n')) {
        auto f = split(line, ':');
        if (f.size() >= 3 && f[0] == grp && small_id(f[2])) {
          id.gid = *small_id(f[2]);
          found = true;
          break;
        }
      }
    }
    if (!found) return field_error("group", "no group '" + grp + "' in the image's /etc/group");
    if (user.empty()) id.uid = -1;
  }
  id.groups = {static_cast<gid_t>(id.gid)};
  // Supplementary groups: those of the image's /etc/group that list the user.
  if (groups && !user_name.empty() && grp.empty()) {
    for (const auto& line : split(*groups, '\n')) {
      auto f = split(line, ':');
      if (f.size() < 4) continue;
      auto gid = small_id(f[2]);
      if (!gid || *gid == id.gid) continue;
      for (const auto& m : split(f[3], ','))
        if (m == user_name && id.groups.size() < 64) id.groups.push_back(static_cast<gid_t>(*gid));
    }
  }
  return id;
}

Result<Identity> task_identity(const std::string& user, const std::string& group,
                               const std::string& default_user, bool allow_root,
                               const std::vector<std::string>* image_roots) {
  std::string u = user.empty() ? default_user : user;
  Identity id;
  if (image_roots) {
    auto in_image = resolve_identity_in_image(u, group, *image_roots);
    // The agent's default user may be absent from the image: then it is the host's.
    if (!in_image.ok() && user.empty() && u == default_user) {
      TRY_ASSIGN(id, resolve_identity(u, group));
    } else {
      TRY_ASSIGN(id, std::move(in_image));
    }
  } else {
    TRY_ASSIGN(id, resolve_identity(u, group));
  }
  if (allow_root) return id;
  bool root_uid = !id.set || id.uid == 0 || (id.uid < 0 && ::getuid() == 0);
  bool root_gid = id.gid == 0;
  for (gid_t g : id.groups) root_gid = root_gid || g == 0;
  if (root_uid)
    return field_error("user",
                       "tasks may not run as root on this machine (agent.toml: "
                       "allow_root_tasks = false)");
  if (root_gid)
    return field_error("group",
                       "tasks may not run with group root on this machine (agent.toml: "
                       "allow_root_tasks = false)");
  return id;
}

}  // namespace weft::agent
