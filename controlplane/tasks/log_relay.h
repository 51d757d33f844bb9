// The control plane's log relay (task.logs, docs/logs.md): a task's output read from
// wherever it runs, through its machine's agent session, one chunk from a cursor per
// call. The control plane keeps no copy. A follower's call is a long poll: the relay asks
// the machine again every 250 ms until there is output, the task ended, or the call's
// wait passed.
//
// It owns the reads in flight and what bounds them: at most 4 reads in flight and a byte
// rate (4 MiB/s, bursts of 1 MiB: a token bucket) per caller connection, 16 reads per
// identity whatever its connections, 256 in all. Who may read, and the audit, are the
// caller's (LogCalls::task_logs, log_calls.h): the relay is told a read is allowed.
//
// Single-threaded: every call on the event loop's thread. Replies go out through the
// caller's session (a deferred reply); a connection that closes drops its reads' replies.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/scheduling/allocator.h"

namespace weft::cp {

class LogRelay {
 public:
  struct Hooks {
    // The machine's agent session, or null when it is not connected.
    std::function<rpc::Session*(MachineId)> agent;
    std::function<std::string(MachineId)> machine_name;
  };
  // One read, as the caller asked it.
  struct Read {
    std::string who;  // the caller's identity (reads are bounded per identity)
    std::string task;
    MachineId machine = 0;
    nlohmann::json ask;  // task.logs for the agent: id, stream, cursor or tail
    size_t max_bytes = 0;
    uint64_t wait_us = 0;  // a long poll: how long the call may wait for output
  };
  static constexpr int kMaxPerConnection = 4;
  static constexpr size_t kMaxPerIdentity = 16;
  static constexpr size_t kMaxReads = 256;

  LogRelay(EventLoop& loop, Hooks hooks) : loop_(loop), hooks_(std::move(hooks)) {}
  LogRelay(const LogRelay&) = delete;
  LogRelay& operator=(const LogRelay&) = delete;

  // Ok when `caller` (identity `who`) may start another read now; else kUnavailable,
  // saying which bound it met.
  Status admit(rpc::Session* caller, const std::string& who);
  // True the first time `caller`'s connection reads `task` (what is audited once).
  bool first_read(rpc::Session* caller, const std::string& task);
  // Starts an admitted read; `caller`'s call is answered when it is done.
  void start(rpc::Session* caller, Read read);
  size_t in_flight() const { return reads_.size(); }

 private:
  struct InFlight {
    Read read;
    rpc::ReplyFn reply;
    rpc::Session* caller = nullptr;  // null once the connection closed
    uint64_t deadline_us = 0;
    Source timer;
  };
  struct Peer {                     // one caller's connection
    std::set<std::string> audited;  // tasks whose logs it read (audited once)
    double tokens = 0;              // bytes it may read now (a token bucket)
    uint64_t at_us = 0;             // when tokens was last brought up to date
    int in_flight = 0;
  };
  Peer& peer(rpc::Session* s);
  void step(uint64_t id);
  void done(uint64_t id, Result<nlohmann::json> r);

  EventLoop& loop_;
  Hooks hooks_;
  std::map<uint64_t, std::unique_ptr<InFlight>> reads_;
  std::map<rpc::Session*, Peer> peers_;
  uint64_t next_id_ = 1;
};

}  // namespace weft::cp
