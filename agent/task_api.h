// The agent's calls (docs/protocol.md): task.* and agent.info on its local socket, each
// checked for privilege where it changes a task, and the control plane's own task calls
// (task.run, stop, logs, show, kill, exec, usage) through its session, which reach only
// the control plane's tasks, by the names it gave them. Every handler validates its
// params and answers with an error naming the field; a failed call changes nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/task.h"
#include "common/result.h"
#include "common/rpc/session.h"

namespace weft::agent {

class Manager;

class TaskApi {
 public:
  explicit TaskApi(Manager& m) : m_(m) {}
  const rpc::Dispatcher& methods() const { return methods_; }
  void register_methods();
  // The API (api.cc): one handler per method, listed in register_methods' table.
  Result<nlohmann::json> api_agent_info(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_run(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_stop(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_kill(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_freeze(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_thaw(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_logs(const nlohmann::json& p, const rpc::CallContext& c);
  // The control plane's task.logs: only its own tasks, named as it named them; those it
  // had the agent forget, from ended-logs/ (TaskDirs::keep_logs).
  Result<nlohmann::json> cp_task_logs(const nlohmann::json& p, const rpc::CallContext& c);
  // The control plane's task by the name it gave it: the live one, else the newest (null
  // when this machine has none; never an operator's local task).
  Task* cp_task(const std::string& name);
  // task.show and task.kill (a signal) of the control plane's own tasks, by name: what
  // `weftctl task show|signal|kill --cluster` reach through the control plane, which
  // checks the caller and hides secrets.
  Result<nlohmann::json> cp_task_show(const nlohmann::json& p);
  Result<nlohmann::json> cp_task_kill(const nlohmann::json& p, const rpc::CallContext& c);
  // task.usage (common/task_usage.h): tasks named as their owner named them; the control
  // plane's only its own.
  Result<nlohmann::json> task_usage(const nlohmann::json& p, const rpc::CallContext& c,
                                    bool control_plane_only);
  Result<nlohmann::json> api_task_usage(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_remove(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_task_wait(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> freeze_task(const nlohmann::json& p, bool freeze);
  // task.run and task.stop: from the local API (after its privilege check) and from the
  // control plane's session (authenticated when it connected), which marks its tasks.
  Result<nlohmann::json> run_task(nlohmann::json params, bool for_control_plane);
  Result<nlohmann::json> stop_task(const nlohmann::json& params);
  Status check_privileged(const rpc::Peer& peer) const;
  Result<Task*> find_task(const nlohmann::json& params);
  nlohmann::json summary(const Task& t) const;
  nlohmann::json detail(Task& t);
  Result<nlohmann::json> cp_exec(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> wait_answer(const std::string& id, bool remove);

 private:
  friend class Manager;
  Manager& m_;
  rpc::Dispatcher methods_;
  uint64_t started_at_us_ = 0;  // the agent's start (agent.info's uptime)
};

}  // namespace weft::agent
