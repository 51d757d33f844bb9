#include "common/log_request.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace weft {

Result<LogRequest> parse_log_request(const nlohmann::json& p, size_t max_bytes_cap,
                                     size_t max_tail) {
  LogRequest r;
  if (p.contains("stream")) {
    if (!p["stream"].is_string() || (p["stream"] != "stdout" && p["stream"] != "stderr"))
      return field_error("stream", "must be \"stdout\" or \"stderr\"");
    r.stream = p["stream"].get<std::string>();
  }
  if (p.contains("max_bytes")) {
    if (!p["max_bytes"].is_number_unsigned() || p["max_bytes"].get<uint64_t>() == 0)
      return field_error("max_bytes", "must be a positive integer");
    r.max_bytes =
        static_cast<size_t>(std::min<uint64_t>(p["max_bytes"].get<uint64_t>(), max_bytes_cap));
  }
  if (p.contains("cursor") && !p["cursor"].is_null()) {
    const nlohmann::json& c = p["cursor"];
    if (!c.is_object() || !c.contains("seq") || !c["seq"].is_number_unsigned() ||
        c["seq"].get<uint64_t>() > UINT32_MAX || !c.contains("offset") ||
        !c["offset"].is_number_unsigned())
      return field_error("cursor", "must be {\"seq\": N, \"offset\": N} from an earlier reply");
    // A file offset is an off_t: past INT64_MAX no read could start there (pread would
    // take it as negative).
    if (c["offset"].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return field_error("cursor.offset", "must be at most " + std::to_string(INT64_MAX));
    r.cursor = LogRequest::Cursor{static_cast<uint32_t>(c["seq"].get<uint64_t>()),
                                  c["offset"].get<uint64_t>()};
  }
  if (p.contains("tail")) {
    if (!p["tail"].is_number_unsigned() || p["tail"].get<uint64_t>() > max_tail)
      return field_error("tail", "must be a number of lines, at most " + std::to_string(max_tail));
    r.tail = static_cast<size_t>(p["tail"].get<uint64_t>());
  }
  return r;
}

}  // namespace weft
