#include "common/json_bounded.h"

namespace weft {

size_t json_nesting_depth(std::string_view text, size_t limit) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit) return limit + 1;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

Result<nlohmann::json> parse_json_bounded(std::string_view text, size_t max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth)
    return make_error("JSON nests deeper than " + std::to_string(max_depth) + " levels");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return make_error("not valid JSON");
  return j;
}

Result<int64_t> int_member(const nlohmann::json& j, const char* key, int64_t dflt, int64_t min,
                           int64_t max, const std::string& prefix) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  const nlohmann::json& v = j[key];
  bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX);
  if (!fits || v.get<int64_t>() < min || v.get<int64_t>() > max)
    return field_error(prefix + key, "must be an integer from " + std::to_string(min) + " to " +
                                         std::to_string(max));
  return v.get<int64_t>();
}

Result<std::string> string_member(const nlohmann::json& p, const char* key) {
  if (!p.is_object() || !p.contains(key) || !p[key].is_string())
    return field_error(key, "is required and must be a string");
  return p[key].get<std::string>();
}

}  // namespace weft
