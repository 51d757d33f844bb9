// `weftctl task exec` through the control plane (docs/operations.md, "A command inside a
// task"): the caller's session and the task's agent's session joined for one command.
// The Manager checks the caller (an operator of the task's entitlement) and audits the
// call with its command line; the relay then only carries bytes:
//
//   caller → task.exec.input  {exec, data?, eof?, ack?, rows?, cols?, close?} → agent
//   agent  → task.exec.output {exec, stream?, data?, ack?}                     → caller
//   agent  → task.exec.exit   {exec, status?, error?}                          → caller
//
// with each side's `exec` number translated. Input is taken only from the session that
// started the exec, output only from the agent's session it runs on; an exec ends when
// either session closes (the command is killed; the caller told why). The windows that
// bound what is in flight are kept by the two ends (agent/exec_sessions.h); the relay
// holds no bytes of its own beyond the sessions' output.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/allocator.h"

namespace weft::cp {

class ExecRelay {
 public:
  static constexpr size_t kMaxPerCaller = 8;
  static constexpr size_t kMax = 256;
  using Agent = std::function<rpc::Session*(MachineId)>;  // the machine's agent, or null

  explicit ExecRelay(Agent agent) : agent_(std::move(agent)) {}
  ~ExecRelay() { *alive_ = false; }
  ExecRelay(const ExecRelay&) = delete;
  ExecRelay& operator=(const ExecRelay&) = delete;

  // Whether an exec on machine m may start for `caller` now: within the limits, and
  // the machine has a session.
  Status admit(rpc::Session* caller, MachineId m, const std::string& machine_name) const;
  // Asks machine m's agent to start the command (`params`: its task.exec's); `reply`
  // gets {exec, machine} once it runs, or the agent's refusal (or admit's).
  void start(rpc::Session* caller, MachineId m, const std::string& machine_name,
             nlohmann::json params, rpc::ReplyFn reply);
  void from_caller(rpc::Session* caller, const nlohmann::json& p);
  // task.exec.output or task.exec.exit (`exit`) from an agent's session.
  void from_agent(rpc::Session* agent, const nlohmann::json& p, bool exit);
  size_t active() const { return execs_.size(); }

 private:
  struct Exec {
    rpc::Session* caller = nullptr;
    rpc::Session* agent = nullptr;
    uint64_t agent_exec = 0;  // 0 until the agent answered
  };
  void watch(rpc::Session* s);
  void closed(rpc::Session* s);

  Agent agent_;
  std::map<uint64_t, Exec> execs_;
  std::map<std::pair<rpc::Session*, uint64_t>, uint64_t> by_agent_;
  std::map<rpc::Session*, bool> watched_;
  uint64_t next_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace weft::cp
