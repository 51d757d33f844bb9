// `weftctl task exec`'s request (task.exec's params, docs/protocol.md): one reader for
// the control plane, which checks it before it asks the agent, and the agent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

// A terminal of this size, or pipes.
struct ExecOptions {
  bool tty = false;
  uint16_t rows = 24, cols = 80;
};

struct ExecRequest {
  std::string task;                  // `id`
  std::vector<std::string> command;  // the program (looked up in the task's PATH) and its arguments
  ExecOptions options;
  std::string term;  // TERM for a terminal ("": xterm)
};
// Errors name the field: id, command (1-256 strings, no NUL, 64 KiB in all), tty, rows
// and cols (1-1000), term (a terminal type's name).
Result<ExecRequest> parse_exec_request(const nlohmann::json& p);
// A terminal's rows or cols in `p` (absent: `dflt`).
Result<uint16_t> exec_dimension(const nlohmann::json& p, const char* name, uint16_t dflt);
// task.exec's params for `r` (what weftctl sends).
nlohmann::json exec_request_json(const ExecRequest& r);

}  // namespace weft
