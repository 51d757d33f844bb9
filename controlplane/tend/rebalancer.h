// The ReBalancer in the control plane (docs/rebalancer.md): the snapshot of one
// entitlement that the planner (rebalance.h) works on, from the allocator's machines and
// the scheduler's ready tasks; `rebalance.plan`'s answer; and the loop that carries plans
// out.
//
// The loop (the leader's): every interval, for each entitlement that is not paused or
// moving between shards, once the moves of its last plan are done, a plan of at most
// moves_per_round moves (and what is left of moves_per_hour) is made with the local
// search and each move is handed to the scheduler (Scheduler::move_task: make before
// break, the job's TaskController asked first, a token of the destructive budget, never
// more than the job's max_unavailable at once). Each move made is an audit entry with its
// aim; refusals are kept in the entitlement's status. A move a controller has not
// acknowledged within move_timeout is withdrawn. Each entitlement's state is a note for
// the next leader (store/notes.h, "rebalance/<entitlement id>", its times as wall-clock
// times): a restarted or new leader keeps the hourly budget spent, waits for the moves
// under way (and withdraws them at their deadline), and shows the same recent moves.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/event.h"
#include "common/result.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/notes.h"
#include "controlplane/tend/rebalance_plan.h"

namespace weft::cp {

struct RebalanceSnapshot {
  rebalance::Fleet fleet;
  std::vector<MachineId> machine_ids;  // fleet.machines[i] is machine_ids[i]
  std::vector<std::string> domains;    // fault domain names by the fleet's index
};

// The entitlement's machines (each with the capacity its listed tasks may use: what
// tasks not in the snapshot hold, starting or stopping ones, is taken off), its jobs,
// and their ready tasks. With room under its quota, usable free-pool machines (in its
// data centre `dc`, "" = any; at most kSparePerDomain a fault domain) as spares: where a
// task may go to restore spread after its domain failed and came back.
inline constexpr size_t kSparePerDomain = 2;
RebalanceSnapshot rebalance_snapshot(const Allocator& alloc, const Scheduler& sched,
                                     EntitlementId e, const std::string& dc = "");

// rebalance.plan's answer for a snapshot: the scores before and after, and the moves
// (`exact`: the GLPK planner, consolidation only).
nlohmann::json rebalance_plan_json(const RebalanceSnapshot& s, const rebalance::Options& o,
                                   bool exact);

// A move's target in the free pool (a spare, rebalance_snapshot) joins the task's
// entitlement first: when the entitlement has room under its quota, or as a swap (the
// task is alone on an unpinned machine, which goes back to the free pool once the task
// left it: the quota is exceeded by one machine only while the move is under way).
// `joined`: whether it did (the caller gives it back when the move is then refused).
Status join_spare(Allocator& alloc, const Scheduler& sched, const std::string& task, MachineId to,
                  bool* joined);

class Rebalancer {
 public:
  struct Options {
    uint64_t interval_us = 60'000'000;
    int64_t moves_per_round = 5;  // in one entitlement
    int64_t moves_per_hour = 30;  // in one entitlement
    uint64_t move_timeout_us = 600'000'000;
  };
  struct Entitlement {
    EntitlementId id = 0;
    std::string name;
    bool paused = false;
    std::string dc;  // its data centre ("" = any)
  };
  // One move made, refused or withdrawn.
  struct Event {
    uint64_t at_us = 0;  // wall clock
    std::string job, task, from, to, aim;
    std::string result;  // "moving", "refused: ...", "withdrawn: ...", "done"
  };
  struct Hooks {
    // The entitlements to tend now (not those moving between shards).
    std::function<std::vector<Entitlement>()> entitlements;
    // Carries a move out (Scheduler::move_task, persisted, sent, the controller asked).
    std::function<Status(const std::string& task, MachineId to, const std::string& reason)> move;
    // A move made: for the audit log.
    std::function<void(const std::string& entitlement, const Event& e)> moved;
  };
  // `notes`: where its state is kept for the next leader (none in a simulation).
  Rebalancer(EventLoop& loop, const Allocator& alloc, Scheduler& sched, Options opts, Hooks hooks,
             Notes* notes = nullptr);
  static constexpr const char* kNotePrefix = "rebalance/";
  // The last leader's notes, before the first round (`mono_now`, `wall_now`: the clocks
  // now, to bring its times back onto this process's monotonic clock). A note that is
  // not well formed is dropped with a warning.
  void restore(const std::map<std::string, nlohmann::json>& notes, uint64_t mono_now,
               uint64_t wall_now);

  // Rounds every interval from now (the leader's: stop() when it steps down).
  void start();
  void stop();
  // One round now (also what the timer runs); at a given monotonic time (a simulation's,
  // bench/autoscale_fleet: the budgets count in that clock).
  void round() { round_at(now_monotonic_us()); }
  void round_at(uint64_t now_us);
  // rebalance.status for one entitlement: paused or not, budgets, moves under way, the
  // last round's plan and outcome, the latest moves.
  nlohmann::json status(const Entitlement& e) const;
  // Entitlements whose spread the last plan could not restore with the machines this
  // control plane holds, by datacenter ("" = any): the fault domains crowded there. A
  // region's shard borrows a machine of another domain from its brokers for them
  // (lending.h).
  std::map<std::string, std::set<std::string>> wanted() const;

 private:
  struct State {
    std::deque<uint64_t> made;               // monotonic times of moves in the last hour
    std::map<std::string, uint64_t> moving;  // task -> when its move was made
    std::map<std::string, Event> moving_event;
    std::deque<Event> recent;  // newest last, at most kRecent
    nlohmann::json last_plan;  // scores before and after, moves planned
    std::string dc;
    std::set<std::string> crowded;  // after the last plan (wanted())
    uint64_t last_round_us = 0;     // wall clock
    std::string outcome;
  };
  static constexpr size_t kRecent = 50;
  void tend(const Entitlement& e, State& st, uint64_t now);
  void record(State& st, Event e);
  void save(EntitlementId id, const State& st, uint64_t now);
  static nlohmann::json event_json(const Event& ev);
  static std::optional<Event> event_from(const nlohmann::json& j);

  EventLoop& loop_;
  const Allocator& alloc_;
  Scheduler& sched_;
  Options opts_;
  Hooks hooks_;
  Notes* notes_;
  std::map<EntitlementId, State> states_;
  Source timer_;
};

}  // namespace weft::cp
