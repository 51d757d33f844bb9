// Autoscaling in the control plane (docs/jobs.md, "Autoscaling"): every interval, the
// usage of each autoscaled job's ready tasks is asked of their machines' agents
// (task.usage: one call a machine for every job's tasks there, answers awaited at most
// `timeout`), summed per job and given to the job's Autoscaler (autoscale.h, the decision
// rules). A decision to resize is carried out through the scale hook (the path of
// job.scale: on the way down the discovery drain first), bounded by the entitlement's
// quota (the largest size that fits), and written to the audit log with its reason. A
// paused job is measured and decided for, not resized: `job.autoscale` shows what it
// would do.
//
// Owned by the tend feature; reads the scheduler, asks the agents through AgentAsks.
// Each job's state is kept as notes for the next leader (store/notes.h): after every
// round "autoscale/<job>" (the figures, the decision, the windows' and rate limits'
// memory, the changes shown), and as each 5-minute slot begins "autoscale-history/<job>"
// (the load history prediction reads). A restarted or new leader goes on from them: no
// scale-down its window would have held, no step its rate limit would have refused, no
// week of history lost (at most the samples of the slot under way). A job whose settings
// changed meanwhile starts a new history, as it would have here.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/rpc/session.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/notes.h"
#include "controlplane/tend/autoscaler.h"
#include "controlplane/usage/agent_asks.h"

namespace weft::cp {

class AutoscaleRounds {
 public:
  struct Hooks {
    // Resizes the job (persisted and sent, as job.scale does); an error when it does not
    // fit or cannot change now.
    std::function<Status(const std::string& job, int count)> scale;
    // A decision carried out or refused: for the audit log.
    std::function<void(const std::string& job, int64_t from, int64_t to, const std::string& reason,
                       const Status& done)>
        decided;
  };
  struct Options {
    uint64_t interval_us = 15'000'000;  // HPA's sync period
    uint64_t timeout_us = 5'000'000;    // a round's answers are awaited this long
  };
  AutoscaleRounds(EventLoop& loop, const Scheduler& sched, AgentAsks& asks, Options opts,
                  Hooks hooks, Notes& notes);
  static constexpr const char* kNotePrefix = "autoscale/";
  static constexpr const char* kHistoryPrefix = "autoscale-history/";
  // The last leader's notes (under both prefixes), taken up as each job's first round
  // here finds it.
  void restore(std::map<std::string, nlohmann::json> notes);

  // Rounds every interval from now (the leader's: stop() when it steps down).
  void start();
  void stop();
  // job.autoscale's view of one job: its settings, the latest figures and decision, and
  // the latest changes made; none if the job does not autoscale.
  std::optional<nlohmann::json> show(const std::string& job) const;

 private:
  struct JobState {
    AutoscaleSpec spec;
    std::unique_ptr<Autoscaler> scaler;
    double total = 0;      // the latest round's load, summed (cores or MiB)
    int64_t measured = 0;  // tasks with figures in it
    int64_t ready = 0;     // ready tasks then
    uint64_t measured_at_us = 0;
    std::optional<AutoscaleDecision> last;
    std::pair<int64_t, int64_t> refused;  // the last resize refused (from, to), recorded once
    std::deque<nlohmann::json> changes;   // the latest, newest last (at most kChangesKept)
    std::string saved;                    // the "autoscale/" note as last written
    uint32_t history_saved = 0;           // the newest slot when its history was written
  };
  static constexpr size_t kChangesKept = 20;
  void round();
  void finish(uint64_t round_id);
  void decide(const std::string& job, JobState& st, uint64_t now_us);
  // The notes of each job whose state changed (after a round), or of one that is gone.
  void save(const std::string& job, JobState& st);
  void forget(const std::string& job);
  // A new scaler's state from the last leader's notes, when they are for these settings.
  void resume(const std::string& job, JobState& st, const nlohmann::json& settings);
  static nlohmann::json settings_of(AutoscaleSpec a);
  AutoscalePolicy policy_of(const JobSpec& spec) const;

  EventLoop& loop_;
  const Scheduler& sched_;
  AgentAsks& asks_;
  Options opts_;
  Hooks hooks_;
  Notes& notes_;
  std::map<std::string, nlohmann::json> restored_;  // the last leader's notes, by key
  std::map<std::string, JobState> jobs_;
  // The round under way: answers outstanding, the load summed per job so far.
  uint64_t round_id_ = 0;
  bool asking_ = false;
  std::map<std::string, std::pair<double, int64_t>> sums_;  // job -> (load, tasks measured)
  std::map<std::string, std::string> job_of_;               // task id -> job, this round
  Source timer_;
};

}  // namespace weft::cp
