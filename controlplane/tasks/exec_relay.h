// `weftctl task exec`'s bytes carried between two sessions (docs/operations.md, "A
// command inside a task"): the caller's and the one upstream that runs the command's
// side, joined for one command. A control plane joins the operator with the task's
// machine's agent; a region's front end joins the operator with the shard that holds the
// task (which joins its session with the agent in turn). Whoever owns the relay checks
// the caller first (the control plane: an operator of the task's entitlement, audited
// with its command line); the relay then only carries bytes:
//
//   caller   → task.exec.input  {exec, data?, eof?, ack?, rows?, cols?, close?} → upstream
//   upstream → task.exec.output {exec, stream?, data?, ack?}                     → caller
//   upstream → task.exec.exit   {exec, status?, error?}                          → caller
//
// with each side's `exec` number translated. Input is taken only from the session that
// started the exec, output only from the upstream session it runs on; an exec ends when
// either session closes (the command is killed; the caller told why). The windows that
// bound what is in flight are kept by the two ends (agent/exec_sessions.h); the relay
// holds no bytes of its own beyond the sessions' output, and does not take the caller's
// `ack` on its word (exec_window.h): it holds at most one window (256 KiB of output) an
// exec whatever the caller says, and at most kMaxPerOperator execs of one operator.
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
#include "controlplane/tasks/exec_window.h"

namespace weft::cp {

class ExecRelay {
 public:
  static constexpr size_t kMaxPerCaller = 8;     // a connection's
  static constexpr size_t kMaxPerOperator = 16;  // one identity's, over its connections
  static constexpr size_t kMax = 256;

  // `upstream`: what the other side is, for the caller's messages ("the machine's agent").
  explicit ExecRelay(std::string upstream) : upstream_(std::move(upstream)) {}
  ~ExecRelay() { *alive_ = false; }
  ExecRelay(const ExecRelay&) = delete;
  ExecRelay& operator=(const ExecRelay&) = delete;

  // Whether an exec may start for `caller` (an operator named `who`) now: within the
  // limits. A front end's session carries many operators' execs: only theirs are counted
  // (`shared`), each by its operator.
  Status admit(rpc::Session* caller, const std::string& who, bool shared = false) const;
  // Calls `method` with `params` on `upstream` to start the command; `reply` gets its
  // answer with this relay's `exec` number once it runs, or the refusal (or admit's).
  void start(rpc::Session* caller, const std::string& who, rpc::Session* upstream,
             const std::string& method, nlohmann::json params, rpc::ReplyFn reply,
             bool shared = false);
  // task.exec.input from a caller's session.
  void from_caller(rpc::Session* caller, const nlohmann::json& p);
  // task.exec.output or task.exec.exit (`exit`) from an upstream session.
  void from_upstream(rpc::Session* upstream, const nlohmann::json& p, bool exit);
  size_t active() const { return execs_.size(); }

 private:
  struct Exec {
    rpc::Session* caller = nullptr;
    rpc::Session* upstream = nullptr;
    std::string who;
    uint64_t upstream_exec = 0;  // 0 until the upstream answered
    ExecWindow window;
  };
  void watch(rpc::Session* s);
  void closed(rpc::Session* s);
  // Ends exec `id` here: the upstream stops the command, the caller is told `why`.
  void end(uint64_t id, const std::string& why);

  std::string upstream_;
  std::map<uint64_t, Exec> execs_;
  std::map<std::pair<rpc::Session*, uint64_t>, uint64_t> by_upstream_;
  std::map<rpc::Session*, bool> watched_;
  uint64_t next_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace weft::cp
