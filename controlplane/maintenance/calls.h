// The control plane's side of planned maintenance (maintenance.h, docs/maintenance.md):
// the maintenance.* calls, the round that moves the events on (every second, and at
// once after a change), and the World through which events drain, stop, reboot and
// return machines.
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class MaintenanceCalls : public Feature {
 public:
  explicit MaintenanceCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;
  void maintenance_round();

 private:
  Maintenance::World maintenance_world(std::vector<Command>* cmds, std::set<MachineId>* touched);
  Result<json> maintenance_schedule(const json& p, const CallContext&);
  Result<json> maintenance_ls(const json& p, const CallContext&);
  Result<json> maintenance_cancel(const json& p, const CallContext&);

  Model& model_;
  Maintenance& maintenance_;
  const std::unique_ptr<GroupCommit>& group_;
  Clocks& clocks_;
  Effects& fx_;
};

}  // namespace weft::cp
