// What a relay of `weftctl task exec` output (the control plane's ExecRelay, a front
// end's FrontExecs) holds for one exec's caller, and how much of the caller's `ack` it
// believes (issue 59: a client that acknowledged output it never read made the control
// plane hold up to 64 MiB an exec).
//
// The relay counts the output bytes it gave the caller's session and notes where each
// message sits in that session's output (rpc::Session::bytes_queued/bytes_sent). An ack
// beyond what was given is a lie: the exec ends. What is passed on upstream is at most
// what has left the session for the socket: a caller cannot have read the rest, so the
// sender never gets more than its window beyond what truly left, and the relay holds at
// most one window an exec whatever the caller says. An honest caller acks only what it
// read, which had left before: it never meets either bound.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/rpc/session.h"

namespace weft::cp {

class ExecWindow {
 public:
  // `bytes` of output were just queued on `to` (the caller's session).
  void gave(const rpc::Session& to, uint64_t bytes);
  // The caller's ack: what to pass upstream (nullopt: nothing new), or the error that
  // ends the exec.
  Result<std::optional<uint64_t>> ack(const rpc::Session& to, uint64_t claimed);
  uint64_t delivered() const { return delivered_; }

 private:
  uint64_t delivered_ = 0;  // output bytes given to the caller's session
  uint64_t acked_ = 0;      // what was passed upstream
  uint64_t left_ = 0;       // output bytes that have left the caller's session
  // (the session's bytes_queued() after an output, delivered_ then), oldest first, for
  // the outputs not yet known to have left.
  std::deque<std::pair<uint64_t, uint64_t>> queued_;
};

// The bytes a base64 text carries (the agent's encoding, with padding).
uint64_t base64_decoded_size(const std::string& b64);

// What a relay passes on, and nothing else: of a caller's task.exec.input (data, eof,
// close, ack, rows, cols; the agent checks each again), and of an agent's
// task.exec.output (stream, data, ack) or task.exec.exit (`exit`: status, error). The
// `exec` number is the relay's to set.
nlohmann::json exec_input_fields(const nlohmann::json& p);
nlohmann::json exec_output_fields(const nlohmann::json& p, bool exit);

}  // namespace weft::cp
