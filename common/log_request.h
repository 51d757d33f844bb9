// task.logs's parameters, as the agent (local callers and the control plane's requests)
// and the control plane (operators) read them: one validator for both (docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

struct LogRequest {
  std::string stream = "stdout";  // or "stderr"
  size_t max_bytes = 65536;       // clamped to the reader's cap
  struct Cursor {
    uint32_t seq = 0;
    uint64_t offset = 0;
  };
  std::optional<Cursor> cursor;  // from an earlier reply
  std::optional<size_t> tail;    // lines before the end, without a cursor
};

// `stream`, `max_bytes` (positive; more than max_bytes_cap reads max_bytes_cap), `cursor`
// ({"seq", "offset"}; null = none) and `tail` (at most max_tail). Errors name the field.
Result<LogRequest> parse_log_request(const nlohmann::json& p, size_t max_bytes_cap,
                                     size_t max_tail);

}  // namespace weft
