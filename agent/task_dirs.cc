#include "agent/task_dirs.h"

#include <errno.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "common/fs.h"

namespace weft::agent {

namespace {

// A control-plane task's name as a directory name: the job-name alphabet and dots.
bool safe_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n[0] == '.') return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
  });
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

TaskDirs::TaskDirs(std::string state_dir, size_t spares)
    : state_dir_(std::move(state_dir)),
      tasks_(state_dir_ + "/tasks"),
      spare_dir_(state_dir_ + "/spare-tasks"),
      ended_dir_(state_dir_ + "/ended-logs"),
      max_spares_(spares) {}

Status TaskDirs::open() {
  TRY(mkdir_p(tasks_, 0750));
  TRY(mkdir_p(spare_dir_, 0700));
  TRY_ASSIGN(std::vector<std::string> names, list_dir(spare_dir_));
  spares_.clear();
  for (const auto& n : names) {
    // Ours are s<number>, each a directory; anything else is not a spare.
    unsigned long long k = 0;
    int used = 0;
    bool ours = std::sscanf(n.c_str(), "s%llu%n", &k, &used) == 1 &&
                static_cast<size_t>(used) == n.size() && is_dir(spare_dir_ + "/" + n);
    if (!ours || spares_.size() >= max_spares_) {
      (void)remove_tree(spare_dir_ + "/" + n);
      continue;
    }
    spares_.push_back(n);
    next_spare_ = std::max<uint64_t>(next_spare_, k + 1);
  }
  // What ended-logs holds, oldest first (by modification time).
  ended_.clear();
  auto kept = list_dir(ended_dir_);
  if (!kept.ok()) return {};
  std::vector<std::pair<int64_t, std::string>> by_age;
  for (const auto& n : *kept) {
    struct stat st {};
    if (!safe_name(n) || ::lstat((ended_dir_ + "/" + n).c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode)) {
      (void)remove_tree(ended_dir_ + "/" + n);
      continue;
    }
    by_age.emplace_back(
        static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, n);
  }
  std::sort(by_age.begin(), by_age.end());
  for (auto& [at, n] : by_age) ended_.push_back(std::move(n));
  while (ended_.size() > kEndedLogsKept) {
    (void)remove_tree(ended_dir_ + "/" + ended_.front());
    ended_.pop_front();
  }
  return {};
}

Status TaskDirs::make(const std::string& id) {
  const std::string dir = path(id);
  const std::string logs = dir + "/logs";
  if (is_dir(dir)) {  // a restart, or a sandbox's made ahead
    if (::mkdir(logs.c_str(), 0750) != 0 && errno != EEXIST) return sys_error("mkdir " + logs);
    return {};
  }
  while (!spares_.empty()) {
    std::string spare = spare_dir_ + "/" + spares_.back();
    spares_.pop_back();
    if (::rename(spare.c_str(), dir.c_str()) == 0) {
      if (::mkdir(logs.c_str(), 0750) != 0 && errno != EEXIST) return sys_error("mkdir " + logs);
      return {};
    }
    (void)remove_tree(spare);  // not renamable: gone, and the next one tried
  }
  return mkdir_p(logs, 0750);
}

bool TaskDirs::empty_for_reuse(const std::string& dir) {
  auto names = list_dir(dir);
  if (!names.ok()) return false;
  for (const auto& n : *names) {
    const std::string p = dir + "/" + n;
    if (n == "exit.tmp") continue;
    if (n == "exit") {
      if (::rename(p.c_str(), (dir + "/exit.tmp").c_str()) != 0) return false;
      continue;
    }
    if (n == "logs" && is_dir(p)) {
      auto files = list_dir(p);
      if (!files.ok()) return false;
      for (const auto& f : *files)
        if (!remove_tree(p + "/" + f).ok()) return false;
      continue;
    }
    if (!remove_tree(p).ok()) return false;
  }
  return true;
}

void TaskDirs::remove(const std::string& id) {
  const std::string dir = path(id);
  if (spares_.size() < max_spares_ && is_dir(dir) && empty_for_reuse(dir)) {
    std::string name = "s" + std::to_string(next_spare_++);
    if (::rename(dir.c_str(), (spare_dir_ + "/" + name).c_str()) == 0) {
      spares_.push_back(std::move(name));
      return;
    }
  }
  (void)remove_tree(dir);
}

void TaskDirs::exit_recorded(const std::string& id) {
  const std::string dir = path(id);
  if (::rename((dir + "/exit").c_str(), (dir + "/exit.tmp").c_str()) != 0)
    ::unlink((dir + "/exit").c_str());
}

void TaskDirs::keep_logs(const std::string& id, const std::string& name, const std::string& state) {
  if (!safe_name(name)) return;
  if (!mkdir_p(ended_dir_, 0700).ok()) return;
  const std::string dest = ended_dir_ + "/" + name;
  (void)remove_tree(dest);
  if (::rename((path(id) + "/logs").c_str(), dest.c_str()) != 0) return;
  (void)write_file(dest + "/state", state);
  ended_.erase(std::remove(ended_.begin(), ended_.end(), name), ended_.end());
  ended_.push_back(name);
  while (ended_.size() > kEndedLogsKept) {
    (void)remove_tree(ended_dir_ + "/" + ended_.front());
    ended_.pop_front();
  }
}

std::string TaskDirs::ended_logs(const std::string& name) const {
  if (std::find(ended_.begin(), ended_.end(), name) == ended_.end()) return "";
  return ended_dir_ + "/" + name;
}

}  // namespace weft::agent
