// The scheduler's replacements (scheduler.h): a task that failed or was lost is replaced
// by a copy of its index elsewhere, paid for from the destructive-operation budget (a
// token bucket, so that a flapping rack cannot shuffle the fleet); what is over the
// budget, or finds no room, waits in order for the next tick.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "controlplane/machines/failure_budget.h"
#include "controlplane/scheduling/job_record.h"

namespace weft::cp {

class Scheduler;

class Replacement {
 public:
  Replacement(Scheduler& s, const SchedulerLimits& limits)
      : s_(s), tokens_{limits.destructive_per_min, limits.destructive_burst} {}
  size_t waiting_for_budget() const { return waiting_.size(); }
  // The broker declared a machine dead or failed: its tasks are LOST and replaced.
  // `prepaid`: the daemon's machine-failure budget paid for this machine; its tasks do
  // not take tokens from the per-task bucket.
  std::vector<Command> machine_down(MachineId m, uint64_t now_us, bool prepaid = false);
  // When machine m's lease ends (Broker::lease_end_us): a lost task of an at-most-one
  // job whose old copy may still run there is replaced only after it, or once the
  // machine reports that copy ended. Unset: no leases (the scheduler's own tests).
  void set_lease_end(std::function<uint64_t(MachineId)> f) { lease_end_ = std::move(f); }
  // Lost tasks of at-most-one jobs waiting for their machine's lease to end.
  size_t waiting_for_lease() const { return fenced_.size(); }
  // The machine reported the old copy of task `id` ended, or not there: its replacement
  // need not wait for the lease.
  void copy_ended(const std::string& id);
  // A fenced task may be replaced now (its lease ended, or its copy did): the daemon
  // ticks at once rather than at the next interval.
  bool fenced_due(uint64_t now_us) const;

 private:
  friend class Scheduler;
  friend class Placer;
  friend class Moves;
  friend class Operations;
  friend class BatchRuns;
  friend class Handover;
  void replace(const std::string& task_id, uint64_t now_us, std::vector<Command>* out,
               bool prepaid = false);
  void wait(const std::string& task_id);  // queues a replacement for the budget
  // Task `id` (LOST) is of an at-most-one job and its old copy may run on: fenced until
  // its machine's lease ends or the machine reports the copy ended.
  void fence(const std::string& task_id, bool prepaid);
  // The fenced tasks whose lease ended (or whose copy ended), replaced now.
  void release_fenced(uint64_t now_us, std::vector<Command>* out);
  template <class Pred>
  void unwait_if(Pred pred) {
    auto keep = std::remove_if(waiting_.begin(), waiting_.end(), [&](const std::string& id) {
      if (!pred(id)) return false;
      waiting_set_.erase(id);
      return true;
    });
    waiting_.erase(keep, waiting_.end());
  }
  // The waiting replacements, oldest first, while the budget lasts (the tick).
  void retry(uint64_t now_us, std::vector<Command>* out);
  // Lost, failed and draining tasks whose index has no running copy wait for their
  // replacement (of one job, or of every job when `only` is null).
  void queue_waits(const std::string* only);

  Scheduler& s_;
  TokenBucket tokens_;
  std::vector<std::string> waiting_;  // LOST/FAILED tasks whose replacement waits
  std::unordered_set<std::string> waiting_set_;
  std::function<uint64_t(MachineId)> lease_end_;
  // fence(): task id -> whether the machine-failure budget paid for it, and whether its
  // copy was reported ended.
  struct Fenced {
    bool prepaid = false, ended = false;
  };
  std::map<std::string, Fenced> fenced_;
};

}  // namespace weft::cp
