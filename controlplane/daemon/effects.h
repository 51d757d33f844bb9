// One path from a decision to its effects (issue 60). The scheduler, autoscaling, the
// ReBalancer, TaskControl, maintenance, moves and the operators' calls decide; this
// turns what they decided into effects, in this order, once:
//
//   1. persist: what changed is written in the current group commit (store/
//      group_commit.h) — the rows the decision names and everything the modules marked
//      changed (moved machines, dirty tasks, changed jobs, dropped maintenance, the
//      broker's events, the features' notes). Nothing of it leaves before that group
//      commits (the output gate holds every reply and command).
//   2. send: the commands go down the machines' agent sessions; a stop of a task that
//      just left service discovery waits until every agent has it (discovery.h); a
//      region's shard fences each command with its holder and epoch.
//   3. kick: the leader's tick soon (next loop iteration), for what follows from it.
//   4. the job's TaskController is asked at once (taskcontrol/), when it has one.
//
// A write that fails sends nothing: what changed stays unsaved for the next write, and
// the commands are sent again from the machines' next reports.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "controlplane/machines/machine_links.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

class AuditLog;
class Clocks;
class ControlRounds;
class Discovery;
class GroupCommit;
class JobEvents;
class Lending;
class Maintenance;
class Notes;
class StateStore;

uint64_t now_us();  // the scheduler's and broker's steady clock

// The model every feature reads and changes: machines, entitlements, jobs and tasks, and
// what the machines' daemons keep open and said last.
struct Model {
  Allocator& alloc;
  Broker& broker;
  Scheduler& sched;
  MachineSessions& sessions;
  MachineReports& reports;
  PoolChanges& pool_changes;
};

// What a decision asks for, beyond what the modules marked changed themselves.
struct Decision {
  std::vector<Command> commands;
  std::set<std::string> jobs;    // rows written with it
  std::set<MachineId> machines;  // rows written with it
  bool kick = false;             // the tick soon after
  std::string ask_controller;    // this job's TaskController asked now
};

class Effects {
 public:
  struct Parts {
    Model& model;
    Maintenance& maintenance;
    JobEvents& job_events;
    Notes& notes;  // what the features keep for the next leader (store/notes.h)
    Clocks& clocks;
    // Made later than this (with the store, the region's parts, when leading): read at
    // each use, each may be unset but the store and its group.
    const std::unique_ptr<Discovery>& discovery;
    const std::unique_ptr<StateStore>& store;
    const std::unique_ptr<GroupCommit>& group;
    const std::unique_ptr<AuditLog>& audit;
    const std::unique_ptr<Lending>& lending;
    const std::unique_ptr<ControlRounds>& control;
  };
  explicit Effects(Parts parts) : p_(parts), m_(parts.model) {}

  // 1 to 4 above. The write's failure is returned (and nothing sent).
  Status apply(const Decision& d);
  // apply() for a decision made outside a request: a failed write is logged.
  void apply_logged(const Decision& d);

  // The steps, for a caller that interleaves its own work between them.
  Status persist(const std::set<std::string>& jobs, const std::set<MachineId>& machines);
  void send(const std::vector<Command>& cmds);
  // Commands straight to the machines (discovery's stops that waited go this way).
  void dispatch(const std::vector<Command>& cmds);
  void kick();
  // Tells each connected sidekick whose machine's desired profile changed (a machine
  // joined or left an entitlement) to apply it now, rather than at its next report.
  void push_profiles();
  // The scheduler's events into the jobs' event logs (job_events.h).
  void take_events();
  // What a job's TaskController (often a task) made the control plane do, in the name
  // of the operator who last created or updated the job.
  void audit_controller(const std::string& job, const std::vector<std::string>& acks,
                        const std::vector<Command>& done);
  std::string machine_name(MachineId m) const;
  // What the features keep for the next leader, written with the next persist().
  Notes& notes() { return p_.notes; }

 private:
  // A machine answered a rolling update's prefetch: its old tasks may roll.
  void prefetched(const std::string& job, uint64_t generation, MachineId m);
  // A machine refused a task.run: the task fails now, with the machine's message.
  void start_refused(const std::string& task, const Error& e, bool bad_spec);

  Parts p_;
  Model& m_;
};

}  // namespace weft::cp
