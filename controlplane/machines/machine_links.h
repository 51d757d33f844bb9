// What the control plane keeps of each machine's daemons beyond the broker's record:
// their sessions (MachineSessions), what they said last (MachineReports: not persisted,
// shown by machine.show), and the machines whose pool changed since the last push of
// their host profile (PoolChanges). Each is owned by the Manager and reached only
// through these interfaces (docs/code-map.md).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/result.h"
#include "common/rpc/server.h"
#include "common/task_report.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

class Broker;

// Remembers `s` as machine m's session in `table` until it closes.
void track_session(std::map<MachineId, rpc::Session*>& table, MachineId m, rpc::Session* s);

// One weft-agent session (task commands, reports) and one weft-sidekick session
// (profile.apply) a machine. A second session for a machine whose session is alive and
// heard from within the dead-machine timeout is refused (kConflict), so it cannot take the
// machine's command channel; a silent one is replaced (and closed).
class MachineSessions {
 public:
  enum class Daemon { kAgent, kSidekick };
  MachineSessions(uint64_t heartbeat_interval_us, int missed_heartbeats)
      : heartbeat_us_(heartbeat_interval_us), missed_(missed_heartbeats) {}
  // The calling session becomes (or stays) machine m's `daemon` session. `name`: the
  // machine's, for messages. `interval_us`: how often that daemon speaks when nothing
  // changes (0 = the heartbeat interval).
  Status claim(Daemon daemon, MachineId m, const std::string& name, const rpc::CallContext& c,
               uint64_t interval_us = 0);
  rpc::Session* agent(MachineId m) const { return find(agents_, m); }
  rpc::Session* sidekick(MachineId m) const { return find(sidekicks_, m); }
  size_t agents() const { return agents_.size(); }
  size_t sidekicks() const { return sidekicks_.size(); }
  // HCS's session of machine m (health.report's): not claimed (HCS speaks in calls of
  // its own), only known, so that close() sends HCS along with the others.
  void track_hcs(MachineId m, rpc::Session* s);
  // Closes machine m's sessions, its agent's, sidekick's and HCS's (it went to another
  // control plane: issue 59, HCS came only at its next keepalive, and the machine was
  // not usable there until then).
  void close(MachineId m);

 private:
  static rpc::Session* find(const std::map<MachineId, rpc::Session*>& t, MachineId m) {
    auto it = t.find(m);
    return it == t.end() ? nullptr : it->second;
  }
  uint64_t heartbeat_us_;
  int missed_;
  std::map<MachineId, rpc::Session*> agents_, sidekicks_, hcs_;
  std::map<rpc::Session*, uint64_t> heard_;  // when each session was last heard from
};

// What each machine's daemons said last: not persisted (a restarted control plane hears
// it all again), forgotten with the machine.
struct MachineReports {
  // A machine's last full task list and its digest (common/task_report.h).
  struct TaskListSeen {
    weft::TaskList tasks;
    weft::TaskDigest sum;        // of tasks, kept up to date by changes
    std::string digest;          // sum.hex(), "" until a whole list came
    uint64_t reconciled_us = 0;  // last report_list of the whole list
  };
  std::unordered_map<MachineId, TaskListSeen> lists;
  std::map<MachineId, nlohmann::json> problems;                 // hcs's, bounded
  std::map<MachineId, nlohmann::json> profile_state;            // sidekick's last switch
  std::map<MachineId, nlohmann::json> controllers;              // the agent's TaskControl links
  std::map<MachineId, std::set<std::string>> profiles_offered;  // the sidekick's profiles
  std::map<MachineId, std::string> boot_ids;                    // what each agent registered with
  // Machines whose agent does not report "ready" (older than readiness checks): their
  // "running" tasks count as ready.
  std::unordered_set<MachineId> running_means_ready;

  void forget(MachineId m);
  // Every profile some machine's sidekick has.
  std::set<std::string> known_profiles() const;
  // `table`'s entry for m, or null.
  static nlohmann::json get(const std::map<MachineId, nlohmann::json>& table, MachineId m) {
    auto it = table.find(m);
    return it == table.end() ? nlohmann::json() : it->second;
  }
};

// Machines whose pool changed: their sidekick may need a new host profile, and the broker
// looks at their readiness again. The push goes to those machines only: the work follows
// the changes, not the fleet.
class PoolChanges {
 public:
  template <typename It>
  void changed(It first, It last) {
    profile_.insert(first, last);
    ready_.insert(first, last);
  }
  std::set<MachineId> take_ready() { return std::exchange(ready_, {}); }
  // The sidekick reported: its reply carries the desired profile.
  void reported(MachineId m) { pushed_.erase(m); }
  void forget(MachineId m) {
    pushed_.erase(m);
    profile_.erase(m);
    ready_.erase(m);
  }
  // Tells each connected sidekick whose machine's desired profile changed to apply it.
  void push(const MachineSessions& sessions, const Broker& broker, const Allocator& alloc);

 private:
  std::set<MachineId> profile_, ready_;
  std::map<MachineId, std::string> pushed_;  // what each sidekick was last told
};

}  // namespace weft::cp
