// File-descriptor ownership and file helpers used by every component. Strings, units and
// clocks have headers of their own (common/strings.h, units.h, clock.h).
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

std::string dirname_of(const std::string& path);

// The gid of a group name (/etc/group, or NSS), or -1 when there is no such group.
int group_gid(const std::string& name);

}  // namespace weft
