// File-descriptor ownership and small file helpers used by every component.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace weft {

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

Result<std::string> read_file(const std::string& path);
// For input files (configs, job files, profiles): a regular file of at most max_bytes,
// else an error naming the path; never reads without bound (`-c /dev/zero`).
Result<std::string> read_file_bounded(const std::string& path, size_t max_bytes);
Result<std::string> read_file_at(int dirfd, const std::string& name);
// Writes the whole string in one write(2) (cgroup and sysfs files need that).
Status write_file(const std::string& path, std::string_view data);
Status write_file_at(int dirfd, const std::string& name, std::string_view data);
// Writes to a temporary file (created afresh with `mode`, less the umask), fsyncs it and
// renames it over `path`.
Status write_file_atomic(const std::string& path, std::string_view data, mode_t mode = 0644);
Status mkdir_p(const std::string& path, mode_t mode = 0755);
Status remove_tree(const std::string& path);
bool path_exists(const std::string& path);
Result<std::vector<std::string>> list_dir(const std::string& path);  // names, no . or ..

std::string trim(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);
std::string dirname_of(const std::string& path);

// "256M", "1G", "4096", "512k" (binary units) -> bytes. "max" is rejected here.
Result<uint64_t> parse_size(std::string_view s);
// "500ms", "5s", "2m", "1h", "1.5s", "10" (seconds) -> microseconds.
Result<uint64_t> parse_duration_us(std::string_view s);
// Durations are capped at 100 years, so that `now + duration` never overflows.
inline constexpr uint64_t kMaxDurationUs = 100ull * 366 * 24 * 3600 * 1'000'000;
// Seconds given as a JSON number; NaN, negative and over-long values are errors.
Result<uint64_t> seconds_to_us(double seconds);
std::string format_size(uint64_t bytes);
// The longest prefix of `s` of at most `max_bytes` that does not end inside a UTF-8
// character: a message cut to a bound stays valid text.
std::string utf8_prefix(std::string_view s, size_t max_bytes);

// "2026-11-22T02:05:03Z" for microseconds since the epoch; empty for <= 0.
std::string format_rfc3339(int64_t realtime_us);
uint64_t now_monotonic_us();
uint64_t now_realtime_us();
std::string random_hex(size_t bytes);
// The gid of a group name, or -1 when there is no such group.
int group_gid(const std::string& name);

}  // namespace weft
