#pragma once

#include <cstddef>
#include <string>

#include "common/rpc/protocol.h"

namespace weft::rpc {

// Splits a byte stream into lines, enforcing a maximum length. A line longer than the
// limit is reported once as overflow and skipped up to its newline; the stream stays
// usable.
class LineReader {
 public:
  explicit LineReader(size_t max_line = kDefaultMaxLine) : max_(max_line) {}
  void feed(const char* data, size_t n);
  enum class Kind { kNone, kLine, kOverflow };
  // Next complete line (without '\n'), or kOverflow for a skipped long line.
  Kind next(std::string* line);
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  size_t max_;
  bool skipping_ = false;
  bool overflow_pending_ = false;
};

}  // namespace weft::rpc
