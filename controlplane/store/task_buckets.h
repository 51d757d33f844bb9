// The task rows an etcd store has written (controlplane/store/etcd_store.h), by job and
// bucket: a job's tasks are kept 64 indexes to a key, so a 36-task job starting is one
// put, not 36. Each row's text is kept as written, serialised once when it changes, so a
// bucket's value is its rows' texts joined (not a JSON object built again); an undo log
// puts the rows a rolled-back write changed back as they were.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::cp {

class TaskBuckets {
 public:
  static constexpr int kTasksPerKey = 64;
  // Task rows by job and bucket, as read back (controlplane/store/etcd_store.cc).
  using Rows = std::map<std::string, std::map<int, std::map<std::string, nlohmann::json>>>;

  // A bucket's key under the store's prefix: "state/tasks/<job>/<bucket, six digits>".
  static std::string key(const std::string& job, int bucket);
  // The value of the bucket `rest` names ("<job>/<bucket>"): its rows as one JSON object
  // {task id: row}; "" when it holds none (the key is deleted).
  std::string value(const std::string& rest) const;
  // Task `id`'s row in `job`'s bucket set to `row`, or removed (nullopt); undone by undo().
  void set(const std::string& job, int bucket, const std::string& id,
           std::optional<std::string> row);
  // The bucket of `job` that holds task `id`, if one does.
  std::optional<int> bucket_of(const std::string& job, const std::string& id) const;
  // Every row of `job` gone (its keys are deleted by range); undone by undo().
  void erase_job(const std::string& job);
  // The rows as loaded: what is in etcd now. The undo log is emptied.
  void load(const Rows& rows);

  // The undo log: mark() where a write starts, undo() back to it, forget() once the
  // writes are sent (or abandoned: the daemon writes what it holds again).
  void mark() { undo_mark_ = undo_.size(); }
  void undo();
  void forget() {
    undo_.clear();
    undo_mark_ = 0;
  }

 private:
  std::map<std::string, std::map<int, std::map<std::string, std::string>>> rows_;
  struct Undo {
    std::string job;
    int bucket;
    std::string id;
    std::optional<std::string> old;
  };
  std::vector<Undo> undo_;
  size_t undo_mark_ = 0;
};

}  // namespace weft::cp
