// What the agent gives a task to run as: its identity (a uid of its own from agent.toml's
// task_uids, handed out in turn, unless the spec, the image or agent.toml names a user)
// and the numbers of its named ports (a 0 a free port of port_range, in turn).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/agent_conf.h"
#include "agent/identity.h"
#include "agent/range_pool.h"
#include "agent/task.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

class Manager;

class TaskIdentities {
 public:
  TaskIdentities(Manager& m, const AgentConfig& cfg)
      : m_(m),
        own_uids_{static_cast<uint64_t>(cfg.task_uid_first),
                  static_cast<uint64_t>(cfg.task_uid_last)} {}
  // The identity `t` runs as under `spec` (its spec with its image's defaults): a uid of
  // its own unless the spec, the image or agent.toml names a user; never the sockets'
  // group, root only where allow_root_tasks. Takes the task's own uid if it has none yet
  // (`t` null: only checks, as create_task does before the task exists).
  Result<Identity> identity_of(Task* t, const TaskSpec& spec,
                               const std::vector<std::string>* image_roots = nullptr);
  void release_own_uid(const std::string& id);
  // Gives the spec's ports their numbers (a 0 a free port of port_range), refusing one
  // another live task holds; WEFT_PORT_<NAME> in its environment.
  Status assign_ports(TaskSpec* spec);

 private:
  friend class Manager;
  friend class TaskApi;
  Manager& m_;
  // Tasks' own uids (agent.toml task_uids), handed out in turn (agent/range_pool.h).
  RangePool own_uids_;
  uint16_t next_port_ = 0;
  // The group of the agent's sockets: no task runs in it.
  int weft_gid_ = -1;
};

}  // namespace weft::agent
