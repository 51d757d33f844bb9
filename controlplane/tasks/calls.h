// One task's calls through the control plane (docs/operations.md, "One task"): task.ls,
// task.show (the record and its agent's detail), task.signal, task.restart (its
// TaskController asked first), task.exec (a command inside it, its bytes carried by
// ExecRelay), and task.unhealthy from a machine's agent (a failed liveness check).
#pragma once

#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class TaskCalls : public Feature {
 public:
  explicit TaskCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;

 private:
  Result<const TaskRecord*> task_for_operation(const json& p) const;
  Result<json> task_ls(const json&, const CallContext&);
  Result<json> task_show(const json& p, const CallContext& c);
  Result<json> task_signal(const json& p, const CallContext& c);
  Result<json> task_exec(const json& p, const CallContext& c);
  Result<json> task_restart(const json& p, const CallContext& c);
  Result<json> task_unhealthy(const json& p, const CallContext& c);

  Model& model_;
  const RegionParts& region_;
  const std::unique_ptr<AgentAsks>& agent_asks_;
  const std::unique_ptr<ExecRelay>& exec_relay_;
  Effects& fx_;
  const Gate& gate_;
};

}  // namespace weft::cp
