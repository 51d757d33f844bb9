// The agent's directories of tasks: <state_dir>/tasks/<id> while a task is known (its
// logs/, where weft-init writes the task's output; its exit record, exit.tmp renamed
// exit once written; an image task's overlay directories), and what is kept of a
// forgotten control-plane task's output (<state_dir>/ended-logs/<name>).
//
// A task's directory is recycled rather than deleted: its removal empties it and keeps
// it (up to `spares`) in <state_dir>/spare-tasks, and the next task's directory is one of
// those renamed into place, its logs/ and exit record's file with it. On ext4, making an
// inode where many were freed moments before scans every recently freed one
// (find_inode_bit, recently_deleted): with short tasks starting and ending 100 at a
// time, the agent's mkdir was 29% of its CPU and weft-init's creation of the exit record
// cost as much again (docs/benchmarks.md, issue 46). A rename makes no inode.
//
// A spare holds nothing of any task: it is emptied before it is renamed into
// spare-tasks, so a crash in between leaves a directory under tasks/ that no record
// names, which the next agent removes as it did before.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "common/result.h"

namespace weft::agent {

class TaskDirs {
 public:
  static constexpr size_t kEndedLogsKept = 64;

  TaskDirs(std::string state_dir, size_t spares);

  // Makes tasks/ and spare-tasks/ and takes stock of what the last agent left there and
  // in ended-logs/ (the oldest beyond kEndedLogsKept go).
  Status open();

  std::string path(const std::string& id) const { return tasks_ + "/" + id; }
  // The task's directory with logs/ in it: as it is, a spare renamed into place, or made.
  Status make(const std::string& id);
  // The task's directory goes: emptied and kept as a spare, or deleted beyond `spares`
  // (or when it cannot be emptied).
  void remove(const std::string& id);
  // The exit record has been read and recorded: its file is kept for the next one
  // (renamed back to exit.tmp, which weft-init overwrites).
  void exit_recorded(const std::string& id);

  // Keeps the task's logs/ as ended-logs/<name> with its final `state`, dropping the
  // oldest beyond kEndedLogsKept; nothing when `name` is not a safe directory name.
  void keep_logs(const std::string& id, const std::string& name, const std::string& state);
  // ended-logs/<name> when it is among those kept, else empty.
  std::string ended_logs(const std::string& name) const;

  size_t spares() const { return spares_.size(); }

 private:
  // Empties `dir` as a spare: logs/ emptied, the exit record's file kept, the rest
  // deleted. False when something could not be removed.
  static bool empty_for_reuse(const std::string& dir);

  const std::string state_dir_, tasks_, spare_dir_, ended_dir_;
  const size_t max_spares_;
  std::vector<std::string> spares_;  // names under spare-tasks/
  uint64_t next_spare_ = 0;
  std::deque<std::string> ended_;  // names under ended-logs/, oldest first
};

}  // namespace weft::agent
