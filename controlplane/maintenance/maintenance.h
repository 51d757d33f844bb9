// Planned maintenance (docs/maintenance.md): unavailability announced ahead for a
// machine, a fault domain (rack or MSB: the `domain` machines register with) or a data
// centre, with a start time and a duration. A pure state machine: the daemon gives it
// the wall-clock time and a World (the broker and scheduler behind callbacks) and
// persists the events it changed.
//
// Lifecycle of an event:
//   scheduled   until `notice` before the start;
//   notified    its machines are drained (make before break; a job with a TaskController
//               moves a task only when the controller acknowledges, and its controller is
//               told of the event and the deadline);
//   in_progress from the start (the deadline): what is still on the machines is stopped
//               (and replaced elsewhere); with `reboot`, each machine, once it runs
//               nothing, is told to reboot (weft-sidekick, if its configuration allows);
//   completing  from the end of the window: each machine returns to service (undrained)
//               once it is alive and healthy (and, if it was told to reboot, has come
//               back since);
//   done, or cancelled (weftctl maintenance cancel: drained machines return at once).
// Machines an operator had drained before stay drained: an event undrains only what it
// drained.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft::cp {

struct MaintenanceEvent {
  uint64_t id = 0;
  std::string target_kind;  // "machine", "domain" or "dc"
  std::string target;
  int64_t start_us = 0;  // wall clock
  uint64_t duration_us = 0;
  uint64_t notice_us = 0;
  std::string reason;
  bool reboot = false;
  std::string state = "scheduled";
  std::set<std::string> machines;                  // affected, fixed at notice
  std::set<std::string> drained;                   // drained by this event (undrained at its end)
  std::map<std::string, int64_t> reboot_sent;      // machine -> when told to reboot
  std::map<std::string, std::string> boot_before;  // machine -> its boot id then
  std::set<std::string> rebooted;                  // came back (registered again) after that
  std::map<std::string, int64_t> reboot_refused;   // machine -> when it refused (asked again later)
  std::string message;                             // what it waits for, when it waits
  int64_t end_us() const { return start_us + static_cast<int64_t>(duration_us); }
  bool active() const { return state != "done" && state != "cancelled"; }
};

nlohmann::json to_json(const MaintenanceEvent& e);
Result<MaintenanceEvent> maintenance_from_json(const nlohmann::json& j);

// The one reader of maintenance.schedule's params (errors name the field): `machine`,
// `domain` or `dc` (exactly one), `start` (RFC 3339 UTC "2026-11-23T14:00:00Z", unix
// seconds, or "+10m" from now), `duration` (1s-7d), `notice` (0-7d, default 15m; from
// now at the latest), `reason` (at most 256 characters), `reboot` (default false).
Result<MaintenanceEvent> parse_maintenance_request(const nlohmann::json& p, int64_t now_us);
// "2026-11-23T14:00:00Z" -> microseconds since the epoch.
Result<int64_t> parse_rfc3339_utc(const std::string& s);

class Maintenance {
 public:
  // What an event does to the cluster, by machine name.
  struct World {
    std::function<std::vector<std::string>(const MaintenanceEvent&)> machines_of;
    std::function<bool(const std::string&)> is_drained;
    std::function<void(const std::string&, bool)> set_drained;  // drain or return to service
    std::function<void(const std::string&)> evict;              // the deadline: stop what is left
    std::function<bool(const std::string&)> empty;              // nothing of the cluster runs there
    std::function<bool(const std::string&)> healthy;
    std::function<bool(const std::string&)> reboot;          // false: could not be asked now
    std::function<std::string(const std::string&)> boot_id;  // the agent's, "" unknown
  };

  // At most this many events are kept (ended ones go first).
  static constexpr size_t kMaxEvents = 1000;
  // Ids from here up are a region's (given by a front end, the same on every shard and
  // broker the event is for); ids below are this control plane's own.
  static constexpr uint64_t kRegionIds = 1'000'000'000;
  // `id`: a region's id (kConflict if this control plane has it already); 0 = the next
  // of its own.
  Result<uint64_t> schedule(MaintenanceEvent e, uint64_t id = 0);
  // Ends an event now: what it drained returns to service. Returns false if unknown or
  // already ended.
  bool cancel(uint64_t id, World& w);
  // A machine's agent registered with this boot id: a machine told to reboot is back
  // when its boot id changed (an agent that sends none: when it registers again).
  // Returns the events that changed.
  std::set<uint64_t> registered(const std::string& machine, const std::string& boot_id,
                                int64_t now_us);
  // Moves every event on. Returns the events that changed (to persist).
  std::set<uint64_t> step(World& w, int64_t now_us);
  // The machine's sidekick refused the reboot (allow_reboot off, systemd refused): asked
  // again kRebootRetryUs later; the reason is the event's message meanwhile.
  static constexpr int64_t kRebootRetryUs = 10'000'000;
  std::set<uint64_t> reboot_refused(const std::string& machine, const std::string& why,
                                    int64_t now_us);
  // Active events that include the machine (notified or later), for TaskControllers.
  std::vector<const MaintenanceEvent*> affecting(const std::string& machine) const;
  const std::map<uint64_t, MaintenanceEvent>& events() const { return events_; }
  void restore(const MaintenanceEvent& e);
  // Undoes a schedule() whose write failed.
  void forget(uint64_t id) { events_.erase(id); }
  // Ended events beyond kMaxEvents, dropped: the ids, for the store.
  std::vector<uint64_t> take_dropped() { return std::exchange(dropped_, {}); }

 private:
  bool step_one(MaintenanceEvent& e, World& w, int64_t now);
  std::map<uint64_t, MaintenanceEvent> events_;
  std::vector<uint64_t> dropped_;
  uint64_t next_id_ = 1;
};

}  // namespace weft::cp
