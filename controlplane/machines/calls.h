// The machines' calls (docs/protocol.md, "Machines"): what a machine's daemons say of it
// (its agent's registration, heartbeats and task reports; its sidekick's profile; its
// hcs's verdict) and what operators ask of machines (machine.ls, show, drain, rm).
// Each machine speaks for itself only (check_machine_identity).
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class MachineCalls : public Feature {
 public:
  explicit MachineCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;
  // machine.rm's work: the machine is listed no more (its registering brings it back).
  // `left_for`: it went, alive, to another control plane of the region (why, logged).
  Status forget_machine(MachineId m, const char* left_for = nullptr);

 private:
  Result<json> machine_register(const json& p, const CallContext& c);
  Result<json> machine_heartbeat(const json& p, const CallContext& c);
  Result<json> machine_report(const std::string& machine, Result<weft::TaskReport> parsed,
                              const CallContext& c);
  Result<json> health_report(const json& p, const CallContext& c);
  Result<json> profile_report(const json& p, const CallContext& c);
  Result<json> machine_ls(const json& p, const CallContext&);
  Result<json> machine_show(const json& p, const CallContext& c);
  Result<json> machine_drain(const json& p, const CallContext& c);
  Result<json> machine_rm(const json& p, const CallContext& c);
  // A machine's agent or sidekick session (machine_links.h).
  Status claim_session(MachineSessions::Daemon d, MachineId m, const CallContext& c,
                       uint64_t interval_us = 0) {
    return model_.sessions.claim(d, m, model_.alloc.spec(m).name, c, interval_us);
  }
  // Sidekick and hcs report on change, and otherwise every keepalive (5 heartbeats).
  uint64_t keepalive_us() const { return 5 * cfg_.broker.heartbeat_interval_us; }

  const CpConfig& cfg_;
  Model& model_;
  Maintenance& maintenance_;
  const std::unique_ptr<Discovery>& discovery_;
  const std::unique_ptr<GroupCommit>& group_;
  const std::unique_ptr<ControlRounds>& control_;
  const RegionParts& region_;
  Effects& fx_;
};

}  // namespace weft::cp
