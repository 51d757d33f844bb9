#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>

namespace weft {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

static Result<std::string> read_all(int fd, const std::string& what) {
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read " + what);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Result<std::string> read_file(const std::string& path) {
  return read_file_at(AT_FDCWD, path);
}

Result<std::string> read_file_bounded(const std::string& path, size_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return sys_error("open " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) < 0) return sys_error("stat " + path);
  if (!S_ISREG(st.st_mode)) return make_error(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return make_error(path + " is larger than " + std::to_string(max_bytes) + " bytes");
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes)
      return make_error(path + " is larger than " + std::to_string(max_bytes) + " bytes");
  }
  return out;
}

Result<std::string> read_file_at(int dirfd, const std::string& name) {
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return sys_error("open " + name);
  return read_all(fd.get(), name);
}

Status write_file(const std::string& path, std::string_view data) {
  return write_file_at(AT_FDCWD, path, data);
}

Status write_file_at(int dirfd, const std::string& name, std::string_view data) {
  Fd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_TRUNC, 0644));
  if (!fd.valid()) return sys_error("open " + name);
  ssize_t n;
  do {
    n = ::write(fd.get(), data.data(), data.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return sys_error("write '" + std::string(data.substr(0, 64)) + "' to " + name);
  if (static_cast<size_t>(n) != data.size()) return make_error("short write to " + name);
  return {};
}

Status write_file_atomic(const std::string& path, std::string_view data, mode_t mode) {
  std::string tmp = path + ".tmp";
  // A leftover temporary file would keep its own mode: start from a new one.
  (void)::unlink(tmp.c_str());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd.valid()) return sys_error("open " + tmp);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("write " + tmp);
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) < 0) return sys_error("fsync " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) < 0) return sys_error("rename " + tmp);
  return {};
}

Status mkdir_p(const std::string& path, mode_t mode) {
  // Creates each missing component with `mode` (less the umask) and leaves every
  // directory that already exists as it is: a socket under /tmp must not strip /tmp's
  // sticky bit, nor a state dir under /var widen /var.
  if (path.empty()) return make_error("mkdir: empty path");
  std::string prefix;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    prefix = path.substr(0, slash);
    pos = slash + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    if (::mkdir(prefix.c_str(), mode) == 0) continue;
    if (errno != EEXIST) return sys_error("mkdir " + prefix);
    struct stat st {};
    if (::stat(prefix.c_str(), &st) < 0) return sys_error("stat " + prefix);
    if (!S_ISDIR(st.st_mode))
      return make_error("mkdir " + path + ": " + prefix + " is not a directory");
  }
  return {};
}

Status remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return errno_error(ec.value(), "remove " + path);
  return {};
}

bool path_exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

Result<std::vector<std::string>> list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return sys_error("opendir " + path);
  std::vector<std::string> out;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(std::move(n));
  }
  ::closedir(d);
  return out;
}

std::string dirname_of(const std::string& path) {
  auto pos = path.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

int group_gid(const std::string& name) {
  struct group* g = ::getgrnam(name.c_str());
  return g ? static_cast<int>(g->gr_gid) : -1;
}

}  // namespace weft
