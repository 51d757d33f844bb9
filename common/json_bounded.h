// Parsing JSON that arrives from outside (request lines, files given to the CLI, rows
// written by an older build) with the nesting bounded *before* a DOM is built: a deep
// document costs stack in the parser, in every copy and in the destructor, so one
// well-formed 200 KB line of '[' could otherwise exhaust a daemon's stack.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

// Deeper than any weft message needs (a task spec nests four levels).
inline constexpr size_t kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in `text`, counting only brackets outside
// strings, or kMaxJsonDepth + 1 as soon as it is exceeded (the scan stops there).
size_t json_nesting_depth(std::string_view text, size_t limit = kMaxJsonDepth);

// Parses `text`; an error (never an exception) when it is not JSON or nests deeper than
// `max_depth`.
Result<nlohmann::json> parse_json_bounded(std::string_view text, size_t max_depth = kMaxJsonDepth);

// The integer member `key` of object `j`, within [min, max]; `dflt` when it is absent or
// null. A value that does not fit (4294967297 as a count) is an error naming
// `prefix + key`, never truncated.
Result<int64_t> int_member(const nlohmann::json& j, const char* key, int64_t dflt, int64_t min,
                           int64_t max, const std::string& prefix = "");
// The string member `key` of object `p`, required: an error naming `key` when `p` is not
// an object or the member is absent or not a string.
Result<std::string> string_member(const nlohmann::json& p, const char* key);

}  // namespace weft
