// The agent's durable task records, in sqlite (agent.db, WAL): what a task is (its
// spec) and where its lifecycle stands, written before each side effect that depends on
// it, so that recovery after a crash can rebuild the task table (agent/manager.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/secret_box.h"
#include "common/store.h"
#include "common/task_spec.h"
#include "common/task_state.h"

namespace weft::agent {

struct TaskRecord {
  std::string id;
  std::string name;
  TaskSpec spec;
  TaskState state = TaskState::kStarting;  // common/task_state.h
  uint64_t incarnation = 0;
  int pid = -1;  // host pid of weft-init
  std::optional<int> exit_code, signal;
  bool core_dumped = false, oom_killed = false;
  int64_t restarts = 0;
  std::string reason;
  bool stop_requested = false;
  int64_t stop_deadline_us = 0;  // realtime
  int64_t next_start_us = 0;     // realtime, in backoff
  int64_t backoff_us = 0;
  int64_t created_us = 0, started_us = 0, finished_us = 0;
  std::vector<std::string> warnings;
  // The uid (and gid) of the task's own, from agent.toml's task_uids; -1: it runs as a
  // named user. Kept for the task's life, restarts included, and never another's.
  long own_uid = -1;
  // Its address on the machine's bridge (host byte order; 0: none), kept likewise.
  uint32_t bridge_addr = 0;

  bool terminal() const { return task_ended(state); }
};

// A task's secret values (env values, files' content) are sealed in agent.db with the
// agent's own key (`box`, state_dir/secrets.key, made at the first start): a copy of
// agent.db (a backup, a support bundle) does not hold them. The agent keeps them, rather
// than asking the control plane again after a restart, because a task restarts (its
// restart policy) and the agent recovers it while the control plane may be away.
class TaskStore {
 public:
  static Result<std::unique_ptr<TaskStore>> open(const std::string& path,
                                                 std::shared_ptr<const SecretBox> box = nullptr);
  Status save(const TaskRecord& t);  // insert or replace
  Status erase(const std::string& id);
  // Every record. A stored spec that no longer parses (written by another version)
  // comes back as a failed task with the reason, never as an error that stops the agent.
  Result<std::vector<TaskRecord>> load();

 private:
  TaskStore(std::unique_ptr<Db> db, std::shared_ptr<const SecretBox> box)
      : db_(std::move(db)), box_(std::move(box)) {}
  std::unique_ptr<Db> db_;
  std::shared_ptr<const SecretBox> box_;
};

}  // namespace weft::agent
