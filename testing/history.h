// A chaos run's history and its checker (issue 61), as Jepsen's checkers read a history
// of operations: what the operators asked and were told, what the agents saw start and
// end (each index of each job, on the host's monotonic clock that every simulated
// machine here shares, so overlaps are exact), and which faults were made and healed.
// check() finds what must never happen:
//   - an index of an at-most-one job running on two machines at any instant;
//   - an acknowledged create, update or scale whose effect is missing after healing
//     (the job gone, or not at the count it was last told to run);
//   - a task started that no decision asked for (a task of no job, or of an index the job
//     never had);
//   - a fault not healed.
// Pure: the test records, the checker reads; it has unit tests of its own
// (testing/history_test.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace weft::testing {

class History {
 public:
  // An operator's call and its answer: `ok` means acknowledged. kind: "create",
  // "update", "scale", "stop"; `count` is what it asked for (create and scale).
  struct Call {
    uint64_t at_us = 0;
    std::string kind, job;
    int count = 0;
    bool ok = false;
  };
  // A copy of an index as an agent saw it: from `began_us` to `ended_us` (0: still running
  // when the history was read).
  struct Copy {
    std::string job, task_id, machine;
    int index = -1;
    uint64_t began_us = 0, ended_us = 0;
  };
  struct Fault {
    std::string what;
    uint64_t made_us = 0, healed_us = 0;  // 0: not healed
  };

  void call(Call c) { calls_.push_back(std::move(c)); }
  void copy(Copy c) { copies_.push_back(std::move(c)); }
  // A fault made now; heal() it by the index this returns.
  size_t fault(std::string what, uint64_t made_us) {
    faults_.push_back({std::move(what), made_us, 0});
    return faults_.size() - 1;
  }
  void heal(size_t fault, uint64_t at_us) { faults_.at(fault).healed_us = at_us; }
  // Which jobs are at most one (their copies must never overlap).
  void at_most_one(const std::string& job) { at_most_one_[job] = true; }

  // After healing: the jobs the control plane shows and the copies each runs (by index).
  struct Final {
    std::map<std::string, int> running;  // job -> running copies
    std::map<std::string, bool> exists;  // job -> shown by job.ls
  };
  // Every violation, one line each (empty: the history is sound).
  std::vector<std::string> check(const Final& after) const;
  // Counts by fault kind (the text before the first ':' of `what`), for the long run's
  // report.
  std::map<std::string, int> fault_counts() const;
  // The whole history as text, for a failure's message.
  std::string dump() const;

  const std::vector<Copy>& copies() const { return copies_; }

 private:
  std::vector<Call> calls_;
  std::vector<Copy> copies_;
  std::vector<Fault> faults_;
  std::map<std::string, bool> at_most_one_;
};

}  // namespace weft::testing
