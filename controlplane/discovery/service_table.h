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
#include "controlplane/scheduling/scheduler.h"

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
  // The jobs published under this name whatever its case (DNS names are case-insensitive).
  std::vector<std::string> any_case(const std::string& job) const;
  // The version at which the job last changed (0: never published).
  uint64_t changed_at(const std::string& job) const;

  // The updates an agent that holds `from` needs to reach version(): the jobs changed
  // since (each with its endpoints, or null when gone). Jobs gone long ago are
  // remembered as gone only while `from` is newer than the oldest kept removal; an agent
  // further behind gets the whole table (reset).
  ServiceUpdate update_since(uint64_t from) const;
  // The whole table, in chunks of at most `per_chunk` jobs: the first resets.
  std::vector<ServiceUpdate> snapshot(size_t per_chunk) const;

  // Agents that answer DNS for the jobs, and the version each acknowledged. One that
  // subscribes with `everything` is sent every job's changes (agents before interest,
  // and agents configured so); the others only the jobs they asked for (interest()),
  // which is what their tasks and DNS clients look up. An agent that is not connected
  // does not hold a stop back (it answers from its copy until it is back and catches up).
  void subscribe(MachineId m, bool everything = true);
  void unsubscribe(MachineId m);
  enum class Interest { kAdded, kHad, kFull };
  // Agent m answers for `job` (case-insensitive) from now on; at most kMaxInterests a
  // machine. An agent subscribed to everything has every job.
  Interest interest(MachineId m, const std::string& job);
  // Agent m no longer answers for `job` (its clients stopped asking): nothing of it is
  // sent there, and no stop waits for m for it. False when m did not have it.
  bool forget(MachineId m, const std::string& job);
  bool wants(MachineId m, const std::string& job) const;
  bool everything(MachineId m) const;
  size_t interests(MachineId m) const;
  // Of the jobs `u` carries, those each agent that asked for jobs wants (agents that
  // want none of them are absent; agents subscribed to everything too).
  std::map<MachineId, std::vector<std::string>> wanted(const ServiceUpdate& u) const;
  // The part of `u` for agent m: `u` itself for an agent with everything, else its jobs
  // (an update with no job and no reset is nothing to send).
  ServiceUpdate part_for(MachineId m, const ServiceUpdate& u) const;
  // A push of `version` went to m (the version it is behind until it acknowledges).
  void sent(MachineId m, uint64_t version);
  uint64_t sent_to(MachineId m) const;
  void ack(MachineId m, uint64_t version);
  uint64_t acked(MachineId m) const;
  bool subscribed(MachineId m) const { return subs_.count(m); }
  size_t subscribers() const { return subs_.size(); }
  static constexpr size_t kMaxInterests = 4096;

  // A stop of a task of `job` that left discovery at `version`: held until every
  // subscriber that answers for the job holds that version (or `ack_deadline_us`
  // passes), then for `drain_us` more.
  void hold_stop(Command c, const std::string& job, uint64_t version, uint64_t now_us,
                 uint64_t ack_timeout_us, uint64_t drain_us);
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
  std::map<std::string, std::set<std::string>> by_lower_;  // lower-case name -> jobs
  std::map<std::string, uint64_t> changed_;                // job -> version of its last change
  std::map<uint64_t, std::string> by_version_;  // the same, by version: update_since reads
                                                // what changed after a version, not all
  std::map<uint64_t, std::string> removals_;    // version -> job erased then
  static constexpr size_t kRemembered = 4096;   // removals kept for update_since
  uint64_t forgotten_ = 0;                      // the newest removal not kept
  struct Subscriber {
    uint64_t acked = 0, sent = 0;
    bool everything = true;
    std::set<std::string> jobs;  // lower case
  };
  std::map<MachineId, Subscriber> subs_;
  std::map<std::string, std::set<MachineId>> wanted_by_;  // lower-case job -> who asked
  // The lowest version the agents told of every job acknowledged (version() when none
  // is); then that and the lowest of the agents that asked for `job`.
  uint64_t acked_by_all() const;
  uint64_t acked_by_all(const std::string& job, uint64_t everywhere) const;
  struct Held {
    Command command;
    std::string job;
    uint64_t version = 0;
    uint64_t ack_deadline_us = 0;
    uint64_t drain_us = 0;
    uint64_t acked_at_us = 0;  // when every agent that answers for it held it (0: not yet)
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
