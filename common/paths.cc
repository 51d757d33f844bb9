#include "common/paths.h"

#include "common/fs.h"
#include "common/strings.h"

namespace weft {

HostPaths::HostPaths(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  if (root_.empty()) root_ = "/";
}

std::string HostPaths::join(const char* top, const std::string& rel) const {
  std::string out = root_ == "/" ? "" : root_;
  out += "/";
  out += top;
  if (!rel.empty()) {
    if (rel.front() != '/') out += "/";
    out += rel;
  }
  return out;
}

Result<std::string> HostPaths::cgroup2_mount() const {
  TRY_ASSIGN(std::string info, read_file(proc("self/mountinfo")));
  // Fields: id parent major:minor root mountpoint opts [optional...] - fstype source superopts
  for (const auto& line : split(info, '\n')) {
    auto sep = line.find(" - ");
    if (sep == std::string::npos) continue;
    auto tail = split(line.substr(sep + 3), ' ');
    if (tail.empty() || tail[0] != "cgroup2") continue;
    auto head = split(line.substr(0, sep), ' ');
    if (head.size() < 5) continue;
    return (root_ == "/" ? "" : root_) + head[4];
  }
  return make_error("no cgroup2 filesystem is mounted (see " + proc("self/mountinfo") + ")");
}

Result<std::string> HostPaths::own_cgroup() const {
  TRY_ASSIGN(std::string data, read_file(proc("self/cgroup")));
  for (const auto& line : split(data, '\n')) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return make_error("no cgroup2 entry in " + proc("self/cgroup"));
}

}  // namespace weft
