// Reading a task's rotated log files (written by weft-init, named per logfiles.h).
// A cursor (file sequence, byte offset) lets `weftctl task logs -f` resume exactly
// where it stopped; a cursor into a file already rotated away resumes at the oldest
// file still present and reports how much was skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace weft::agent {

struct LogCursor {
  unsigned seq = 0;
  uint64_t offset = 0;
};

struct LogChunk {
  std::string data;
  LogCursor next;
  uint64_t skipped = 0;  // bytes lost between the cursor and `data` (rotated away)
};

struct LogStats {
  unsigned files = 0;
  uint64_t bytes = 0;    // on disk now
  uint64_t dropped = 0;  // deleted by rotation or failed to write
};

// Files of one stream in sequence order.
std::vector<unsigned> log_sequence(const std::string& dir, const std::string& stream);
LogStats log_stats(const std::string& dir, const std::string& stream);

// Reads up to max_bytes from `from` (or from the start of the oldest file). With
// tail_lines and no cursor, starts that many lines before the end instead.
Result<LogChunk> read_log(const std::string& dir, const std::string& stream,
                          std::optional<LogCursor> from, size_t max_bytes,
                          std::optional<size_t> tail_lines = std::nullopt);

}  // namespace weft::agent
