// `weftctl task exec` on the agent (docs/operations.md, "A command inside a task"): a
// command joined to one of the control plane's running tasks (weft-init --join-pid: the
// task's namespaces, root, credentials, capabilities and seccomp filter, in a cgroup of
// its own beneath the task's), with a terminal (a pseudo-terminal whose master the agent
// holds) or with pipes, its bytes carried as notifications on the session that asked:
//
//   task.exec.output (agent → control plane)  {exec, stream: stdout|stderr, data (base64),
//                                              ack: input bytes written to the command}
//   task.exec.exit                             {exec, status, signal?, error?}
//   task.exec.input  (control plane → agent)  {exec, data?, eof?, ack?, rows?, cols?, close?}
//
// Flow control: each way at most kWindow bytes are sent and not yet acknowledged (`ack`:
// how many the other side has consumed, counted from the start). A command whose output
// is not read blocks on its write; input beyond the window is refused and ends the exec.
// An exec ends when its command exited and its output was read to the end (at most
// kDrainUs after the exit: a child that kept the output open does not hold it), when the
// session it was asked on closes, or on `close`; its cgroup, with everything it
// started, goes then.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/exec_request.h"
#include "common/fs.h"
#include "common/result.h"
#include "common/rpc/session.h"

namespace weft::agent {

class Reaper;

// How one exec's command is started (Manager::plan_exec): weft-init's path and
// arguments (init_argv with InitJoin), the task's pidfd (borrowed) and the exec's cgroup.
struct ExecStart {
  std::string init_path;
  std::vector<std::string> init_argv;
  int pidfd = -1;
  std::string cgroup_dir;
};

class ExecSessions {
 public:
  static constexpr uint64_t kWindow = 256 * 1024;
  static constexpr uint64_t kDrainUs = 2'000'000;
  static constexpr size_t kMaxPerTask = 4;
  static constexpr size_t kMax = 32;
  // The exec's cgroup for exec number `n` of `task`, or why not; and its removal once the
  // exec ended (what it started killed): true once it is gone, else asked again every
  // 100 ms (the killed are leaving), for up to a minute.
  using Plan = std::function<Result<ExecStart>(uint64_t n)>;
  using Ended = std::function<bool(const std::string& task, uint64_t n)>;

  ExecSessions(EventLoop& loop, Reaper& reaper, Ended ended);
  ~ExecSessions();
  ExecSessions(const ExecSessions&) = delete;
  ExecSessions& operator=(const ExecSessions&) = delete;

  // Starts the command for `task` (the agent's id of it) on `session` (the control
  // plane's); {exec: n} or why not (kConflict past the limits).
  Result<nlohmann::json> start(rpc::Session* session, const std::string& task,
                               const ExecOptions& options, const Plan& plan);
  // task.exec.input from `session`; unknown execs are ignored (they ended meanwhile).
  void input(rpc::Session* session, const nlohmann::json& p);
  size_t active() const { return execs_.size(); }

 private:
  struct Exec;
  Result<nlohmann::json> spawn(rpc::Session* session, const std::string& task,
                               const ExecOptions& options, uint64_t n, const ExecStart& how);
  void watch_session(rpc::Session* s);
  void session_closed(rpc::Session* s);
  void arm_output(Exec& e, int stream);
  void on_output(uint64_t n, int stream);
  void arm_input(Exec& e);
  void on_input(uint64_t n);
  void on_exit(uint64_t n);
  void maybe_finish(Exec& e);
  void finish(uint64_t n, std::string error = {});
  void kill(Exec& e);

  EventLoop& loop_;
  Reaper& reaper_;
  Ended ended_;
  std::map<uint64_t, std::unique_ptr<Exec>> execs_;
  uint64_t next_ = 0;
  std::map<rpc::Session*, bool> watched_;
  // Ended execs whose cgroup is not gone yet: (task, n) -> tries left.
  void retry_ended();
  std::map<std::pair<std::string, uint64_t>, int> leaving_;
  Source leaving_timer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace weft::agent
