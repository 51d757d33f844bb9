#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/strings.h"

namespace weft {

// Splits "12.5ms" into 12.5 and "ms". Rejects empty numbers, signs and junk.
static bool split_number(std::string_view s, double* num, std::string* unit) {
  std::string t = trim(s);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) return false;
  std::string digits = t.substr(0, i);
  if (digits.find('.') != digits.rfind('.')) return false;
  char* end = nullptr;
  *num = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size() || !std::isfinite(*num)) return false;
  *unit = trim(t.substr(i));
  return true;
}

Result<uint64_t> parse_size(std::string_view s) {
  double n;
  std::string unit;
  if (!split_number(s, &n, &unit)) {
    return make_error("'" + std::string(s) + "' is not a size (examples: 4096, 512K, 256M, 2G)");
  }
  double mult = 1;
  std::string u;
  for (char c : unit) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u.empty() || u == "B")
    mult = 1;
  else if (u == "K" || u == "KB" || u == "KIB")
    mult = 1024.0;
  else if (u == "M" || u == "MB" || u == "MIB")
    mult = 1024.0 * 1024;
  else if (u == "G" || u == "GB" || u == "GIB")
    mult = 1024.0 * 1024 * 1024;
  else if (u == "T" || u == "TB" || u == "TIB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return make_error("unknown size unit '" + unit + "' in '" + std::string(s) + "'");
  double v = n * mult;
  if (v >= 1.8e19) return make_error("size '" + std::string(s) + "' is too large");
  return static_cast<uint64_t>(v);
}

Result<uint64_t> parse_duration_us(std::string_view s) {
  double n;
  std::string unit;
  if (!split_number(s, &n, &unit)) {
    return make_error("'" + std::string(s) + "' is not a duration (examples: 500ms, 5s, 2m)");
  }
  double mult;
  if (unit.empty() || unit == "s")
    mult = 1e6;
  else if (unit == "ms")
    mult = 1e3;
  else if (unit == "us")
    mult = 1;
  else if (unit == "m" || unit == "min")
    mult = 60e6;
  else if (unit == "h")
    mult = 3600e6;
  else
    return make_error("unknown duration unit '" + unit + "' in '" + std::string(s) + "'");
  double v = n * mult;
  if (v > static_cast<double>(kMaxDurationUs))
    return make_error("duration '" + std::string(s) + "' is longer than 100 years");
  return static_cast<uint64_t>(v);
}

Result<uint64_t> seconds_to_us(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return make_error("must be a non-negative number");
  double v = seconds * 1e6;
  if (v > static_cast<double>(kMaxDurationUs)) return make_error("is longer than 100 years");
  return static_cast<uint64_t>(v);
}

std::string format_size(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f%s" : "%.1f%s", v, units[i]);
  return buf;
}

}  // namespace weft
