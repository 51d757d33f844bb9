// The control plane's questions to machines' agents, each bounded in time (a session's
// call waits as long as the agent does):
//  - usage: what tasks use (task.usage, common/task_usage.h), one call a machine, all at
//    once, answered together once every machine answered or the timeout passed
//    (autoscaling's rounds, `top`);
//  - call: one call to one machine's agent, answered by the agent or, past the timeout,
//    with kTimeout (task.show, task.signal through the control plane).
//
// Owned by the Manager; an ask outstanding when it is destroyed is never answered (the
// sessions are closed before it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/rpc/session.h"
#include "common/task_usage.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

class AgentAsks {
 public:
  struct Answer {
    uint64_t interval_ms = 0;  // the agents' sampling interval (the largest answered)
    std::map<std::string, TaskUsage> tasks;
    std::map<std::string, std::string> scrape_errors;
    std::vector<MachineId> silent;  // asked, and no usable answer in time (or no session)
  };
  using Agent = std::function<rpc::Session*(MachineId)>;  // the machine's agent, or null
  using Done = std::function<void(Answer)>;

  AgentAsks(EventLoop& loop, Agent agent) : loop_(loop), agent_(std::move(agent)) {}
  AgentAsks(const AgentAsks&) = delete;
  AgentAsks& operator=(const AgentAsks&) = delete;

  // Asks each machine its request at once; `done` once all answered or `timeout_us`
  // after (at once when there is nothing to ask). Figures of tasks not asked for are
  // left out.
  void usage(std::map<MachineId, UsageRequest> asks, uint64_t timeout_us, Done done);
  // `method` of machine m's agent; `reply` with its answer, kUnavailable at once when the
  // machine has no session, kTimeout when it has not answered within `timeout_us`.
  void call(MachineId m, const std::string& method, nlohmann::json params, uint64_t timeout_us,
            rpc::ReplyFn reply);
  size_t outstanding() const { return pending_.size() + calls_.size(); }

 private:
  struct Pending {
    std::set<MachineId> waiting;
    std::set<std::string> asked;
    Answer answer;
    Done done;
    Source deadline;
  };
  void answered(uint64_t id, MachineId m, Result<nlohmann::json> r);
  void finish(uint64_t id);

  EventLoop& loop_;
  Agent agent_;
  std::map<uint64_t, Pending> pending_;
  struct Call {
    rpc::ReplyFn reply;
    Source deadline;
  };
  void called(uint64_t id, Result<nlohmann::json> r);
  std::map<uint64_t, Call> calls_;
  uint64_t next_ = 0;
};

}  // namespace weft::cp
