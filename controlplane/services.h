// Service discovery in the control plane (docs/services.md): each job's endpoints (its
// ready tasks), versioned; which agents hold which version; and the stops that wait until
// their task's withdrawal has reached every agent that answers for it (Twine disables a
// task's discovery before it stops or moves it; here the stop also waits for the agents'
// acknowledgements, bounded by a timeout, and then the job's discovery_drain).
//
// Pure: no I/O and no clock of its own. The manager feeds it the endpoints, the agents'
// acknowledgements and the time, and sends what it releases.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/services.h"
#include "controlplane/scheduler.h"

namespace weft::cp {

class ServiceTable {
 public:
  // The job's endpoints now (in index order). Returns the tasks that left discovery
  // (were published, are not now). A change makes a new version.
  std::vector<std::string> set(const std::string& job, const Service& s);
  // The job is gone: its endpoints leave (the tasks that were published).
  std::vector<std::string> erase(const std::string& job);
  uint64_t version() const { return version_; }
  // Versions start here (a control plane starts at its wall clock, so that the versions
  // an agent holds keep growing across restarts).
  void start_at(uint64_t v) { version_ = std::max(version_, v); }
  const std::map<std::string, Service>& services() const { return services_; }
  const Service* find(const std::string& job) const;
  // The version at which the job last changed (0: never published).
  uint64_t changed_at(const std::string& job) const;

  // The updates an agent that holds `from` needs to reach version(): the jobs changed
  // since (each with its endpoints, or null when gone). Jobs gone long ago are
  // remembered as gone only while `from` is newer than the oldest kept removal; an agent
  // further behind gets the whole table (reset).
  ServiceUpdate update_since(uint64_t from) const;
  // The whole table, in chunks of at most `per_chunk` jobs: the first resets.
  std::vector<ServiceUpdate> snapshot(size_t per_chunk) const;

  // Agents that answer for the jobs (every agent that serves DNS) and the version each
  // acknowledged. An agent that is not connected does not hold a stop back (it answers
  // from its copy until it is back and catches up).
  void subscribe(MachineId m) { acked_.emplace(m, 0); }
  void unsubscribe(MachineId m) { acked_.erase(m); }
  void ack(MachineId m, uint64_t version);
  uint64_t acked(MachineId m) const;
  bool subscribed(MachineId m) const { return acked_.count(m); }
  size_t subscribers() const { return acked_.size(); }
  // The lowest version every subscriber holds (version() when there is none).
  uint64_t everywhere() const;

  // A stop of a task that left discovery at `version`: held until every subscriber holds
  // that version (or `ack_deadline_us` passes), then for `drain_us` more.
  void hold_stop(Command c, uint64_t version, uint64_t now_us, uint64_t ack_timeout_us,
                 uint64_t drain_us);
  struct Released {
    std::vector<Command> commands;
    std::vector<std::string> timed_out;  // tasks whose acknowledgements did not all come
  };
  Released release(uint64_t now_us);
  size_t held() const { return held_.size(); }
  bool holds(const std::string& task) const;
  // When release() may next have something to do (0: nothing held).
  uint64_t next_deadline_us() const;

 private:
  void removed(const std::string& job);
  uint64_t version_ = 0;
  std::map<std::string, Service> services_;
  std::map<std::string, uint64_t> changed_;     // job -> version of its last change
  std::map<uint64_t, std::string> by_version_;  // the same, by version: update_since reads
                                                // what changed after a version, not all
  std::map<uint64_t, std::string> removals_;    // version -> job erased then
  static constexpr size_t kRemembered = 4096;   // removals kept for update_since
  uint64_t forgotten_ = 0;                      // the newest removal not kept
  std::map<MachineId, uint64_t> acked_;
  struct Held {
    Command command;
    uint64_t version = 0;
    uint64_t ack_deadline_us = 0;
    uint64_t drain_us = 0;
    uint64_t acked_at_us = 0;  // when every subscriber held it (0: not yet)
  };
  std::vector<Held> held_;
};

// The endpoints of a job from its tasks: those running (or draining) and ready, on a
// machine whose address is known, the newest of each index first.
Service endpoints_of(const std::string& entitlement, const std::vector<TaskRecord>& tasks,
                     const std::function<std::string(MachineId)>& machine_name,
                     const std::function<std::string(MachineId)>& address);
Service endpoints_of(const std::string& entitlement, const std::vector<const TaskRecord*>& tasks,
                     const std::function<std::string(MachineId)>& machine_name,
                     const std::function<std::string(MachineId)>& address);

}  // namespace weft::cp
