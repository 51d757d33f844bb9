#include "agent/image/layer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "common/fs.h"
#include "common/units.h"

namespace weft::image {

namespace {

struct ReadFree {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct WriteFree {
  void operator()(archive* a) const { archive_write_free(a); }
};

// "./a//b/" -> "a/b"; empty for the root itself; an error for ".." or an absolute path.
Result<std::string> clean_path(const char* raw) {
  if (!raw) return make_error("an entry without a name");
  std::string_view p(raw);
  if (p.size() > PATH_MAX) return make_error("an entry name longer than PATH_MAX");
  if (!p.empty() && p.front() == '/')
    return make_error("'" + std::string(p.substr(0, 200)) + "' is an absolute path");
  std::string out;
  size_t i = 0;
  while (i <= p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string_view::npos) j = p.size();
    std::string_view c = p.substr(i, j - i);
    if (c == "..") return make_error("'" + std::string(p.substr(0, 200)) + "' climbs out with ..");
    if (!c.empty() && c != ".") {
      if (!out.empty()) out += '/';
      out += c;
    }
    i = j + 1;
  }
  return out;
}

// Opens `rel` beneath `root` without following any symlink or leaving `root`.
int open_beneath(int root, const std::string& rel, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC | O_NOFOLLOW);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(
      syscall(SYS_openat2, root, rel.empty() ? "." : rel.c_str(), &how, sizeof how));
}

// The directory `rel` beneath `root`, made (0755) where missing: an fd, or -1 with errno.
int dir_beneath(int root, const std::string& rel) {
  int fd = open_beneath(root, "", O_RDONLY | O_DIRECTORY);
  if (fd < 0 || rel.empty()) return fd;
  size_t i = 0;
  while (i < rel.size()) {
    size_t j = rel.find('/', i);
    if (j == std::string::npos) j = rel.size();
    std::string c = rel.substr(i, j - i);
    if (mkdirat(fd, c.c_str(), 0755) != 0 && errno != EEXIST) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    int next = open_beneath(fd, c, O_RDONLY | O_DIRECTORY);
    int e = errno;
    close(fd);
    if (next < 0) {
      errno = e;
      return -1;
    }
    fd = next;
    i = j + 1;
  }
  return fd;
}

// Keeps only the extended attributes an image may set: user.* and file capabilities
// (trusted.* would forge overlayfs's own metadata; security.* beyond capabilities is the
// host's LSM labelling).
void filter_xattrs(archive_entry* e) {
  struct X {
    std::string name;
    std::string value;
  };
  std::vector<X> keep;
  archive_entry_xattr_reset(e);
  const char* name = nullptr;
  const void* value = nullptr;
  size_t size = 0;
  while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
    if (!name) continue;
    std::string n(name);
    if (n.rfind("user.", 0) == 0 || n == "security.capability")
      keep.push_back({n, std::string(static_cast<const char*>(value), size)});
  }
  archive_entry_xattr_clear(e);
  for (const auto& x : keep)
    archive_entry_xattr_add_entry(e, x.name.c_str(), x.value.data(), x.value.size());
}

std::string archive_message(archive* a) {
  const char* m = archive_error_string(a);
  return m ? m : "unknown libarchive error";
}

// libarchive's error on `a` as an Error that keeps its errno (ENOSPC must stay ENOSPC).
Error archive_error(archive* a, const std::string& what) {
  int e = archive_errno(a);
  if (e == ENOSPC || e == EDQUOT) return errno_error(ENOSPC, what + ": " + archive_message(a));
  return make_error(what + ": " + archive_message(a));
}

// Room for `need` more bytes on the filesystem of `fd` above `limits.reserve_bytes`.
}  // namespace

Status check_room(int fd, uint64_t need, uint64_t reserve_bytes) {
  if (reserve_bytes == 0) return {};
  struct statvfs sv {};
  if (fstatvfs(fd, &sv) != 0) return sys_error("statvfs of the image store");
  uint64_t avail = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  if (avail >= reserve_bytes && avail - reserve_bytes >= need) return {};
  return errno_error(ENOSPC, "it needs " + format_size(need) + " more, and the disk has " +
                                 format_size(avail) + " free of which " +
                                 format_size(reserve_bytes) +
                                 " is the image cache's reserve (images.reserve)");
}

Result<UnpackStats> unpack_layer(int fd, const std::string& dir, oci::Compression c,
                                 const UnpackLimits& limits) {
  char real[PATH_MAX];
  if (!realpath(dir.c_str(), real)) return sys_error("layer directory " + dir);
  std::string root = real;
  std::string prefix = root == "/" ? "/" : root + "/";
  Fd rootfd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!rootfd.valid()) return sys_error("open " + root);

  std::unique_ptr<archive, ReadFree> in(archive_read_new());
  std::unique_ptr<archive, WriteFree> out(archive_write_disk_new());
  if (!in || !out) return make_error("libarchive: out of memory");
  archive_read_support_format_tar(in.get());
  switch (c) {
    case oci::Compression::kNone:
      archive_read_support_filter_none(in.get());
      break;
    case oci::Compression::kGzip:
      archive_read_support_filter_gzip(in.get());
      break;
    case oci::Compression::kZstd:
      archive_read_support_filter_zstd(in.get());
      break;
    case oci::Compression::kAny:  // libarchive picks by the magic bytes; none if neither
      archive_read_support_filter_gzip(in.get());
      archive_read_support_filter_zstd(in.get());
      archive_read_support_filter_none(in.get());
      break;
  }
  int flags = ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_XATTR |
              ARCHIVE_EXTRACT_SECURE_SYMLINKS | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
              ARCHIVE_EXTRACT_SAFE_WRITES;
  if (geteuid() == 0) flags |= ARCHIVE_EXTRACT_OWNER;
  archive_write_disk_set_options(out.get(), flags);
  if (archive_read_open_fd(in.get(), fd, 1 << 16) != ARCHIVE_OK)
    return make_error("layer is not a tar stream: " + archive_message(in.get()));

  UnpackStats st;
  for (;;) {
    archive_entry* e = nullptr;
    int r = archive_read_next_header(in.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) return make_error("layer: " + archive_message(in.get()));
    if (++st.entries > limits.max_entries)
      return make_error("layer has more than " + std::to_string(limits.max_entries) + " entries");
    auto rel = clean_path(archive_entry_pathname(e));
    if (!rel.ok()) return make_error("layer entry refused: " + rel.error().message);
    if (rel->empty()) continue;  // "./": the root, which the layer directory is
    mode_t type = archive_entry_filetype(e);
    if (type == AE_IFREG) {
      int64_t size = archive_entry_size(e);
      if (size < 0 || static_cast<uint64_t>(size) > limits.max_bytes - st.bytes)
        return errno_error(EFBIG, "layer is larger than " + format_size(limits.max_bytes) +
                                      " uncompressed (the image cache's limit)");
      st.bytes += static_cast<uint64_t>(size);
      TRY(check_room(rootfd.get(), static_cast<uint64_t>(size), limits.reserve_bytes));
    }
    size_t slash = rel->rfind('/');
    std::string parent = slash == std::string::npos ? "" : rel->substr(0, slash);
    std::string base = slash == std::string::npos ? *rel : rel->substr(slash + 1);
    if (base.rfind(".wh.", 0) == 0) {
      ++st.whiteouts;
      int pfd = dir_beneath(rootfd.get(), parent);
      if (pfd < 0) return sys_error("whiteout " + *rel + ": parent directory");
      Fd p(pfd);
      if (base == ".wh..wh..opq") {
        if (fsetxattr(p.get(), "trusted.overlay.opaque", "y", 1, 0) != 0)
          return sys_error("opaque whiteout " + *rel);
      } else {
        std::string name = base.substr(4);
        if (name.empty() || name == "." || name == "..")
          return make_error("layer entry refused: whiteout '" + *rel + "' names nothing");
        (void)unlinkat(p.get(), name.c_str(), 0);
        if (mknodat(p.get(), name.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0)
          return sys_error("whiteout " + *rel);
      }
      continue;
    }
    if (type == AE_IFCHR || type == AE_IFBLK) {
      ++st.skipped_devices;
      continue;
    }
    std::string full = prefix + *rel;
    archive_entry_set_pathname(e, full.c_str());
    if (const char* hl = archive_entry_hardlink(e)) {
      auto target = clean_path(hl);
      if (!target.ok() || target->empty())
        return make_error("layer entry refused: hard link " + *rel + " -> " +
                          (target.ok() ? std::string("the root") : target.error().message));
      std::string t = prefix + *target;
      archive_entry_set_hardlink(e, t.c_str());
    }
    filter_xattrs(e);
    r = archive_write_header(out.get(), e);
    if (r < ARCHIVE_WARN) return archive_error(out.get(), "layer entry " + *rel);
    if (type == AE_IFREG && archive_entry_size(e) > 0) {
      const void* buf = nullptr;
      size_t len = 0;
      la_int64_t off = 0;
      uint64_t since_check = 0;
      for (;;) {
        r = archive_read_data_block(in.get(), &buf, &len, &off);
        if (r == ARCHIVE_EOF) break;
        if (r < ARCHIVE_WARN) return archive_error(in.get(), "layer entry " + *rel);
        // Others write to this disk too: the reserve is looked at again every 8 MiB.
        since_check += len;
        if (since_check >= (8u << 20)) {
          since_check = 0;
          TRY(check_room(rootfd.get(), 8u << 20, limits.reserve_bytes));
        }
        // A failed write is ARCHIVE_WARN here, not worse: without this check a layer cut
        // short by a full disk would be finished (truncated up to its size: zeros).
        if (archive_write_data_block(out.get(), buf, len, off) < 0)
          return archive_error(out.get(), "layer entry " + *rel);
      }
    }
    if (archive_write_finish_entry(out.get()) < ARCHIVE_WARN)
      return archive_error(out.get(), "layer entry " + *rel);
  }
  // Directory modes and times are set last (a read-only directory still takes entries).
  if (archive_write_close(out.get()) != ARCHIVE_OK) return archive_error(out.get(), "layer");
  return st;
}

Result<UnpackChild> start_unpack_confined(const std::string& blob, const std::string& dir,
                                          oci::Compression c, const UnpackLimits& limits) {
  Fd in(open(blob.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return sys_error("open " + blob);
  Fd root(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return sys_error("open " + dir);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) return sys_error("pipe");
  Fd rd(pipefd[0]), wr(pipefd[1]);
  int pidfd = -1;
  struct clone_args ca {};
  ca.flags = CLONE_PIDFD;
  ca.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  ca.exit_signal = SIGCHLD;
  pid_t pid = static_cast<pid_t>(syscall(SYS_clone3, &ca, sizeof ca));
  if (pid < 0) return sys_error("clone3");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // Directories the tar implies (a parent it has no entry for) get 0755 as in any
    // image builder, whatever umask the agent runs with (its unit's is 0027).
    umask(022);
    std::string reply;
    if (fchdir(root.get()) != 0 || chroot(".") != 0 || chdir("/") != 0) {
      reply = "E chroot into the layer directory: " + std::string(strerror(errno));
    } else {
      auto r = unpack_layer(in.get(), "/", c, limits);
      // Every file of the layer on disk before the caller's rename makes it usable.
      if (r.ok() && syncfs(root.get()) != 0)
        reply = "E sync the layer: " + std::string(strerror(errno));
      else if (r.ok())
        reply = "O " + std::to_string(r->entries) + " " + std::to_string(r->bytes) + " " +
                std::to_string(r->whiteouts) + " " + std::to_string(r->skipped_devices);
      else {
        // The errno travels apart from the text, so the caller's Error has it once.
        Error e = r.error();
        int n = std::exchange(e.errnum, 0);
        reply = "E " + std::to_string(n) + " " + e.str();
        if (n != 0) reply += std::string(": ") + strerror(n);
      }
    }
    if (reply.size() > 4000) reply.resize(4000);  // one atomic pipe write
    (void)!write(wr.get(), reply.data(), reply.size());
    _exit(0);
  }
  UnpackChild child;
  child.pid = pid;
  child.pidfd = Fd(pidfd);
  child.reply = std::move(rd);
  return child;
}

Result<UnpackStats> finish_unpack_confined(UnpackChild& child, bool wait) {
  int status = 0;
  pid_t got;
  do {
    got = waitpid(child.pid, &status, wait ? 0 : WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == 0) return make_error("layer unpack still running");
  child.pid = -1;
  std::string reply;
  char buf[4096];
  for (;;) {
    ssize_t n = read(child.reply.get(), buf, sizeof buf);
    if (n > 0) {
      reply.append(buf, static_cast<size_t>(n));
      if (reply.size() > 65536) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error("layer unpack ended abnormally (status " + std::to_string(status) + ")");
  if (reply.rfind("O ", 0) == 0) {
    UnpackStats st;
    if (sscanf(reply.c_str() + 2, "%lu %lu %lu %lu", &st.entries, &st.bytes, &st.whiteouts,
               &st.skipped_devices) == 4)
      return st;
  }
  if (reply.rfind("E ", 0) == 0) {
    // "E <errno> <text>": the text already ends with the errno's words.
    char* end = nullptr;
    long n = strtol(reply.c_str() + 2, &end, 10);
    std::string text = end && *end == ' ' ? std::string(end + 1) : reply.substr(2);
    if (n == ENOSPC || n == EFBIG) {  // the kinds the image service tells apart
      std::string words = std::string(": ") + strerror(static_cast<int>(n));
      if (text.size() > words.size() && text.ends_with(words)) {
        text.resize(text.size() - words.size());
        return errno_error(static_cast<int>(n), text);
      }
    }
    return make_error(text);
  }
  return make_error("layer unpack gave no answer");
}

void UnpackChild::kill_and_reap() {
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
  }
}

Result<UnpackStats> unpack_layer_confined(const std::string& blob, const std::string& dir,
                                          oci::Compression c, const UnpackLimits& limits) {
  TRY_ASSIGN(UnpackChild child, start_unpack_confined(blob, dir, c, limits));
  return finish_unpack_confined(child, true);
}

}  // namespace weft::image
