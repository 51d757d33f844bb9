// What tasks use, asked of their machines' agents (task.usage, common/task_usage.h): one
// call a machine, all at once, answered together once every machine answered or the
// timeout passed. Autoscaling's rounds and `top` (weftctl top) ask through it.
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
#include "controlplane/allocator.h"

namespace weft::cp {

class UsageAsks {
 public:
  struct Answer {
    uint64_t interval_ms = 0;  // the agents' sampling interval (the largest answered)
    std::map<std::string, TaskUsage> tasks;
    std::map<std::string, std::string> scrape_errors;
    std::vector<MachineId> silent;  // asked, and no usable answer in time (or no session)
  };
  using Agent = std::function<rpc::Session*(MachineId)>;  // the machine's agent, or null
  using Done = std::function<void(Answer)>;

  UsageAsks(EventLoop& loop, Agent agent) : loop_(loop), agent_(std::move(agent)) {}
  UsageAsks(const UsageAsks&) = delete;
  UsageAsks& operator=(const UsageAsks&) = delete;

  // Asks each machine its request at once; `done` once all answered or `timeout_us`
  // after (at once when there is nothing to ask). Figures of tasks not asked for are
  // left out.
  void ask(std::map<MachineId, UsageRequest> asks, uint64_t timeout_us, Done done);
  size_t outstanding() const { return pending_.size(); }

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
  uint64_t next_ = 0;
};

}  // namespace weft::cp
