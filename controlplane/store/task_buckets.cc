#include "controlplane/store/task_buckets.h"

#include <cstdio>
#include <cstdlib>

namespace weft::cp {

std::string TaskBuckets::key(const std::string& job, int bucket) {
  char b[16];
  std::snprintf(b, sizeof b, "%06d", bucket);
  return "state/tasks/" + job + "/" + b;
}

std::string TaskBuckets::value(const std::string& rest) const {
  size_t slash = rest.rfind('/');
  if (slash == std::string::npos) return {};
  auto jt = rows_.find(rest.substr(0, slash));
  if (jt == rows_.end()) return {};
  auto bt = jt->second.find(std::atoi(rest.c_str() + slash + 1));
  if (bt == jt->second.end() || bt->second.empty()) return {};
  size_t size = 2;
  for (const auto& [id, row] : bt->second) size += id.size() + row.size() + 4;
  std::string out;
  out.reserve(size);
  out += '{';
  for (const auto& [id, row] : bt->second) {
    if (out.size() > 1) out += ',';
    out += nlohmann::json(id).dump();  // an id is a job's name and a number: escaped as JSON
    out += ':';
    out += row;
  }
  out += '}';
  return out;
}

void TaskBuckets::set(const std::string& job, int bucket, const std::string& id,
                      std::optional<std::string> row) {
  auto& rows = rows_[job][bucket];
  auto it = rows.find(id);
  std::optional<std::string> old;
  if (it != rows.end()) old = std::move(it->second);
  if (row)
    rows[id] = std::move(*row);
  else if (it != rows.end())
    rows.erase(it);
  undo_.push_back({job, bucket, id, std::move(old)});
}

std::optional<int> TaskBuckets::bucket_of(const std::string& job, const std::string& id) const {
  auto jt = rows_.find(job);
  if (jt == rows_.end()) return std::nullopt;
  for (const auto& [bucket, rows] : jt->second)
    if (rows.count(id)) return bucket;
  return std::nullopt;
}

void TaskBuckets::erase_job(const std::string& job) {
  auto it = rows_.find(job);
  if (it == rows_.end()) return;
  for (auto& [bucket, rows] : it->second)
    for (auto& [id, row] : rows) undo_.push_back({job, bucket, id, std::move(row)});
  rows_.erase(it);
}

void TaskBuckets::load(const Rows& rows) {
  rows_.clear();
  forget();
  for (const auto& [job, buckets] : rows)
    for (const auto& [bucket, ids] : buckets)
      for (const auto& [id, row] : ids) rows_[job][bucket][id] = row.dump();
}

void TaskBuckets::undo() {
  while (undo_.size() > undo_mark_) {
    Undo u = std::move(undo_.back());
    undo_.pop_back();
    auto& rows = rows_[u.job][u.bucket];
    if (u.old)
      rows[u.id] = std::move(*u.old);
    else
      rows.erase(u.id);
  }
}

}  // namespace weft::cp
