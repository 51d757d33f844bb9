// How the calls find the machine a request names, and how they show a machine and a
// task (docs/protocol.md): shared by every feature that answers about them.
#pragma once

#include <string>

#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/machines/broker.h"
#include "controlplane/machines/machine_links.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

// The machine `p.machine` names, for an operator's call: not found once removed.
Result<MachineId> machine_of(const Broker& broker, const nlohmann::json& p);
// The machine a machine's own call names (register aside): the session must be allowed
// to speak for it (check_machine_identity), checked before anything else is said.
Result<MachineId> own_machine(const Broker& broker, const nlohmann::json& p,
                              const rpc::CallContext& c);
Result<MachineId> own_machine(const Broker& broker, const std::string& id,
                              const rpc::CallContext& c);

// machine.ls's and machine.show's row for a machine.
nlohmann::json machine_json(MachineId m, const Allocator& alloc, const Broker& broker,
                            const MachineReports& reports, const MachineSessions& sessions);
// task.ls's row for a task.
nlohmann::json task_json(const TaskRecord& t, const Allocator& a);

}  // namespace weft::cp
