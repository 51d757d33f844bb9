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

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string dirname_of(const std::string& path) {
  auto pos = path.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

// Splits "12.5ms" into 12.5 and "ms". Rejects empty numbers, signs and junk.
static bool split_number(std::string_view s, double* num, std::string* unit) {
  std::string t = trim(s);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) return false;
  std::string digits = t.substr(0, i);
  if (digits.find('.') != digits.rfind('.')) return false;
  char* end = nullptr;
  *num = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size() || !std::isfinite(*num)) return false;
  *unit = trim(t.substr(i));
  return true;
}

std::string utf8_prefix(std::string_view s, size_t max_bytes) {
  size_t cut = std::min(s.size(), max_bytes);
  while (cut > 0 && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut));
}

Result<uint64_t> parse_size(std::string_view s) {
  double n;
  std::string unit;
  if (!split_number(s, &n, &unit)) {
    return make_error("'" + std::string(s) + "' is not a size (examples: 4096, 512K, 256M, 2G)");
  }
  double mult = 1;
  std::string u;
  for (char c : unit) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u.empty() || u == "B")
    mult = 1;
  else if (u == "K" || u == "KB" || u == "KIB")
    mult = 1024.0;
  else if (u == "M" || u == "MB" || u == "MIB")
    mult = 1024.0 * 1024;
  else if (u == "G" || u == "GB" || u == "GIB")
    mult = 1024.0 * 1024 * 1024;
  else if (u == "T" || u == "TB" || u == "TIB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return make_error("unknown size unit '" + unit + "' in '" + std::string(s) + "'");
  double v = n * mult;
  if (v >= 1.8e19) return make_error("size '" + std::string(s) + "' is too large");
  return static_cast<uint64_t>(v);
}

Result<uint64_t> parse_duration_us(std::string_view s) {
  double n;
  std::string unit;
  if (!split_number(s, &n, &unit)) {
    return make_error("'" + std::string(s) + "' is not a duration (examples: 500ms, 5s, 2m)");
  }
  double mult;
  if (unit.empty() || unit == "s")
    mult = 1e6;
  else if (unit == "ms")
    mult = 1e3;
  else if (unit == "us")
    mult = 1;
  else if (unit == "m" || unit == "min")
    mult = 60e6;
  else if (unit == "h")
    mult = 3600e6;
  else
    return make_error("unknown duration unit '" + unit + "' in '" + std::string(s) + "'");
  double v = n * mult;
  if (v > static_cast<double>(kMaxDurationUs))
    return make_error("duration '" + std::string(s) + "' is longer than 100 years");
  return static_cast<uint64_t>(v);
}

Result<uint64_t> seconds_to_us(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return make_error("must be a non-negative number");
  double v = seconds * 1e6;
  if (v > static_cast<double>(kMaxDurationUs)) return make_error("is longer than 100 years");
  return static_cast<uint64_t>(v);
}

std::string format_size(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f%s" : "%.1f%s", v, units[i]);
  return buf;
}

std::string format_rfc3339(int64_t us) {
  if (us <= 0) return "";
  time_t s = static_cast<time_t>(us / 1000000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

uint64_t now_monotonic_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

uint64_t now_realtime_us() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

int group_gid(const std::string& name) {
  struct group* g = ::getgrnam(name.c_str());
  return g ? static_cast<int>(g->gr_gid) : -1;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

}  // namespace weft
