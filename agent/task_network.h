// A task's network on this machine: the namespace it enters (one made ahead, or one made
// and plugged into the machine's bridge), namespaces.network "own" resolved for this
// machine, and the bridge's table publishing exactly the live bridge tasks' ports.
#pragma once

#include <memory>
#include <string>

#include "agent/bridge.h"
#include "agent/netns_pool.h"
#include "agent/task.h"
#include "common/fs.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

class Manager;

class TaskNetwork {
 public:
  explicit TaskNetwork(Manager& m) : m_(m) {}
  // The network namespace a task with one of its own enters: one made ahead (NetnsPool)
  // or, for a bridge task, one made now and plugged into the bridge; an invalid Fd when
  // none is ready for a task without a bridge (the child then makes its own).
  Result<Fd> task_netns(Task& t, bool bridged);
  void publish_bridge();
  // After the tasks were recovered: the bridge's ports that no live task holds swept (a
  // start that died left them), and its table published.
  void after_recovery();
  // namespaces.network "own" made "bridge" or "private" for this machine; a bridge task
  // refused where there is no bridge.
  Status resolve_network(TaskSpec* spec) const;
  Status refuse_without_bridge(const TaskSpec& spec) const;

 private:
  friend class Manager;
  Manager& m_;
  std::unique_ptr<NetnsPool> netns_pool_;
  bool netns_pool_failure_logged_ = false;
  // The machine's bridge (agent.toml [bridge]; null: none, or it could not be made, and
  // why). publish_bridge() makes its table publish exactly the live bridge tasks' ports.
  std::unique_ptr<Bridge> bridge_;
  std::string bridge_failure_;
};

}  // namespace weft::agent
