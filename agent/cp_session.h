// The agent's session with the control plane (agent.toml control_plane):
//  - registers the machine (machine.register: its size, labels, boot id, what it serves);
//  - reports the control plane's tasks: the whole list on a new session, then only the
//    changes against the list the control plane acknowledged last, or only a digest
//    while nothing changed (common/task_report.h), one report in flight at a time;
//  - hands the ended tasks a reply's "forget" names back to the agent, which drops them;
//  - carries the control plane's commands (task.run, task.stop, ...) to `commands`.
// It reconnects with exponential backoff (0.5 s to 30 s); tasks keep running while the
// control plane is away.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/agent_conf.h"
#include "common/clock.h"
#include "common/cp_link.h"
#include "common/event.h"
#include "common/rpc/session.h"

namespace weft::agent {

// One of the control plane's tasks as this machine reports it.
struct ReportedTask {
  std::string state;  // task_state_name(); "ready" for a running task that is ready
  bool failed = false;
  std::string reason;         // why it failed
  bool setup_failed = false;  // before its program ran
};

// What a report carries after the last acknowledged one.
struct Report {
  nlohmann::json params;  // machine.report's
  std::string digest;     // of `states`
  std::map<std::string, std::string> states;
};
// machine.report's params for `tasks` (by name): only the digest while it is the
// acknowledged one's, the changes against `acked` when one was acknowledged, else the
// whole list; with why each failed task it names failed (cut well under the control
// plane's bound, on a character boundary).
Report build_report(const std::string& machine, const std::map<std::string, ReportedTask>& tasks,
                    const std::map<std::string, std::string>& acked,
                    const std::string& acked_digest);

// machine.register's params: `cfg`'s machine and labels, this host's CPUs, memory,
// controllers and boot id.
// `task_ports`: the ports its tasks hold now (their own listeners are not the machine's).
// `discovery_interest`: the jobs its DNS clients asked for (null: it is told of every job).
nlohmann::json machine_registration(const AgentConfig& cfg, bool serves_discovery,
                                    const std::set<uint16_t>& task_ports = {},
                                    const std::vector<std::string>* discovery_interest = nullptr);

// Which control plane of a region holds this machine, and under which epoch
// (docs/regions.md): learnt from each machine.register reply's "holder". A command that
// names another holder or an older epoch (sent before the machine moved, arriving late)
// is refused with kConflict and logged, whatever it asks, as is one that names no holder
// while a shard holds the machine; with no holder (an all-in-one control plane) a command
// naming none is taken. The fields are taken off what the command carries.
class HolderFence {
 public:
  // machine.register's reply: {"holder": {"shard", "epoch"}}, or no holder (all-in-one).
  void registered(const nlohmann::json& reply);
  Result<nlohmann::json> admit(nlohmann::json params, const std::string& method) const;
  const std::string& holder() const { return holder_; }
  uint64_t epoch() const { return epoch_; }

 private:
  std::string holder_;
  uint64_t epoch_ = 0;
};

class CpSession {
 public:
  struct Hooks {
    std::function<std::map<std::string, ReportedTask>()> tasks;  // the control plane's, now
    std::function<void(const std::set<std::string>&)> forget;    // names of ended tasks
    std::function<std::set<uint16_t>()> task_ports;  // ports its tasks hold (registration)
    // The jobs its DNS clients asked for (registration's discovery_interest); unset: the
    // agent is told of every job.
    std::function<std::vector<std::string>()> discovery_interest;
    // The machine's lease (agent/machine_lease.h): machine.register's reply (its terms),
    // and the send time of each call the control plane answered (a renewal).
    std::function<void(const nlohmann::json&)> lease_terms;
    std::function<void(uint64_t)> renewed;
    // True while the lease matters here (tasks it fences run): no quiet heartbeats, so
    // each one is answered and renews it.
    std::function<bool()> needs_lease;
  };
  static Result<std::unique_ptr<CpSession>> start(EventLoop& loop, const AgentConfig& cfg,
                                                  const rpc::Dispatcher* commands,
                                                  bool serves_discovery, Hooks hooks);
  ~CpSession();

  // A task changed: the control plane hears of it now, not at the next heartbeat.
  // Coalesced over 20 ms.
  void report_soon();
  void report_now();
  bool connected() { return link_->session() != nullptr; }
  ControlPlaneLink* link() { return link_.get(); }
  // What the control plane says of a quiet heartbeat (report.resend, report.forget):
  // the whole list now, or these ended tasks dropped.
  void resend();
  void forget(const nlohmann::json& params);
  // One of the control plane's tasks failed its liveness check `failure_threshold`
  // times in a row (task.unhealthy, a notification): the control plane restarts it,
  // asking its TaskController first. False when there is no session to say it on.
  bool unhealthy(const std::string& task, const std::string& reason);
  // service.interest: the control plane tells this agent of these jobs from now on, and
  // no more of those in `forget`; the reply is the asked jobs' endpoints now. False when
  // there is no session to ask on.
  bool ask_services(const std::vector<std::string>& jobs, const std::vector<std::string>& forget,
                    std::function<void(Result<nlohmann::json>)> reply);
  // A command from the control plane (task.run, task.stop, image.pull): its params
  // without the holder fields, or refused when from a holder this machine left.
  Result<nlohmann::json> admit(nlohmann::json params, const std::string& method) const {
    return fence_.admit(std::move(params), method);
  }

 private:
  CpSession(EventLoop& loop, std::string machine, Hooks hooks)
      : loop_(loop), machine_(std::move(machine)), hooks_(std::move(hooks)) {}
  void report(rpc::Session& s);

  EventLoop& loop_;
  const std::string machine_;
  Hooks hooks_;
  std::unique_ptr<ControlPlaneLink> link_;
  // The task list the control plane acknowledged last, and its digest ("" = none: the
  // whole list next).
  std::map<std::string, std::string> acked_;
  std::string acked_digest_;
  bool in_flight_ = false, again_ = false;
  bool quiet_ok_ = false;      // the control plane takes unanswered heartbeats (its hello said)
  WallClockSteps wall_steps_;  // read at each report: a step is logged
  // report.resend came: a report sent before it must not set the acknowledged list when
  // its answer comes (the control plane had not kept it).
  uint64_t resends_ = 0;
  HolderFence fence_;
  Source later_, soon_;
};

}  // namespace weft::agent
