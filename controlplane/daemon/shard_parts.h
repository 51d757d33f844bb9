// What the control plane's features are made from (issue 60): one reference to each part
// the composition root (Manager) owns, passed to every feature's constructor, which
// keeps only those it uses. A feature's members are the list of what it needs; this
// struct is only how they are handed over, once, at construction.
//
// The parts made later than the features (the store and its group commit when the store
// opens, the leader's parts when this control plane leads) are handed over as the
// owning pointers themselves: a feature reads them at each call, and each but the store,
// its group and the audit log may be unset (a follower, or a feature that is off).
#pragma once

#include <memory>

#include "common/event.h"
#include "common/rpc/session.h"
#include "common/secret_box.h"
#include "controlplane/api/audit_log.h"
#include "controlplane/api/calls.h"
#include "controlplane/api/gate.h"
#include "controlplane/daemon/clocks.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/daemon/effects.h"
#include "controlplane/discovery/discovery.h"
#include "controlplane/entitlements/profile_rolls.h"
#include "controlplane/jobs/job_events.h"
#include "controlplane/jobs/periodic.h"
#include "controlplane/machines/broker.h"
#include "controlplane/machines/lookup.h"
#include "controlplane/machines/machine_links.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/region/region_parts.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/group_commit.h"
#include "controlplane/store/replica_role.h"
#include "controlplane/store/state_store.h"
#include "controlplane/taskcontrol/control_rounds.h"
#include "controlplane/tasks/exec_relay.h"
#include "controlplane/tasks/log_relay.h"
#include "controlplane/usage/agent_asks.h"
#include "controlplane/usage/usage_glance.h"

namespace weft::cp {

// A feature of the control plane: it answers the calls it registers (api/calls.h).
class Feature {
 public:
  using json = nlohmann::json;
  using CallContext = rpc::CallContext;
  virtual ~Feature() = default;
  virtual void register_calls(Calls& calls) = 0;
};

struct ShardParts {
  const CpConfig& cfg;
  EventLoop& loop;
  Model& model;
  // Features' own state that the leader's rounds also move on.
  Maintenance& maintenance;
  ProfileRolls& profile_rolls;
  JobEvents& job_events;
  PeriodicRuns& periodic;
  Clocks& clocks;
  const ReplicaRole& replica;
  // Made later (see above).
  const std::unique_ptr<Discovery>& discovery;
  const std::unique_ptr<StateStore>& store;
  const std::unique_ptr<GroupCommit>& group;
  const std::unique_ptr<AuditLog>& audit;
  const std::unique_ptr<ControlRounds>& control;
  const std::unique_ptr<AgentAsks>& agent_asks;
  const std::unique_ptr<ExecRelay>& exec_relay;
  const std::unique_ptr<LogRelay>& log_relay;
  const std::unique_ptr<UsageGlance>& usage_glance;
  const std::shared_ptr<const SecretBox>& secrets;
  RegionParts& region;
  // The calls' table (a front end's forward hands a call on through it).
  const rpc::Dispatcher& methods;
  // The one path from a decision to its effects, and who may call.
  Effects& fx;
  const Gate& gate;
};

}  // namespace weft::cp
