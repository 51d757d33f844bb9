#include "common/prometheus_text.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace weft {

namespace {

bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool name_char(char c) {
  return name_start(c) || (c >= '0' && c <= '9');
}

Error line_error(size_t line, const std::string& what) {
  return make_error("line " + std::to_string(line) + ": " + what);
}

// A float as the format writes it: a decimal or Go-style number, +Inf, -Inf, NaN.
bool parse_value(std::string_view s, double* out) {
  if (s.empty() || s.size() > 64) return false;
  if (s == "+Inf" || s == "Inf") {
    *out = INFINITY;
    return true;
  }
  if (s == "-Inf") {
    *out = -INFINITY;
    return true;
  }
  if (s == "NaN") {
    *out = NAN;
    return true;
  }
  for (char c : s)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return false;
  std::string copy(s);
  char* end = nullptr;
  *out = std::strtod(copy.c_str(), &end);
  return end && *end == '\0';
}

}  // namespace

bool valid_metric_name(std::string_view name) {
  if (name.empty() || name.size() > 200 || !name_start(name[0])) return false;
  for (char c : name)
    if (!name_char(c)) return false;
  return true;
}

Result<double> prometheus_sum(std::string_view body, std::string_view name) {
  if (body.size() > kMaxMetricsBody) return make_error("more than 1 MiB of metrics");
  double sum = 0;
  bool found = false;
  size_t line_no = 0;
  while (!body.empty()) {
    size_t nl = body.find('\n');
    std::string_view line = body.substr(0, nl);
    body = nl == std::string_view::npos ? std::string_view() : body.substr(nl + 1);
    if (++line_no > kMaxMetricsLines) return make_error("more than 100,000 lines of metrics");
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == line.size() || line[i] == '#') continue;  // blank, comment, HELP, TYPE
    // The metric's name.
    size_t start = i;
    if (!name_start(line[i])) return line_error(line_no, "a sample must start with a metric name");
    while (i < line.size() && name_char(line[i])) ++i;
    std::string_view metric = line.substr(start, i - start);
    // Its labels: {name="value",...}, values with \\, \" and \n escapes.
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        while (i < line.size() && line[i] == ' ') ++i;
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        if (i >= line.size() || !name_start(line[i]) || line[i] == ':')
          return line_error(line_no, "a label name is expected");
        while (i < line.size() && name_char(line[i]) && line[i] != ':') ++i;
        while (i < line.size() && line[i] == ' ') ++i;
        if (i >= line.size() || line[i] != '=') return line_error(line_no, "'=' is expected");
        ++i;
        while (i < line.size() && line[i] == ' ') ++i;
        if (i >= line.size() || line[i] != '"')
          return line_error(line_no, "a label value must be quoted");
        ++i;
        bool closed = false;
        while (i < line.size()) {
          char c = line[i++];
          if (c == '"') {
            closed = true;
            break;
          }
          if (c == '\\') {
            if (i >= line.size() || (line[i] != '\\' && line[i] != '"' && line[i] != 'n'))
              return line_error(line_no, "a label value has a bad escape");
            ++i;
          }
        }
        if (!closed) return line_error(line_no, "a label value is not closed");
        while (i < line.size() && line[i] == ' ') ++i;
        if (i < line.size() && line[i] == ',') {
          ++i;
          continue;
        }
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        return line_error(line_no, "',' or '}' is expected after a label");
      }
    }
    // The value, then an optional timestamp (an integer of milliseconds).
    if (i >= line.size() || (line[i] != ' ' && line[i] != '\t'))
      return line_error(line_no, "a value is expected after the metric");
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t vstart = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    double v = 0;
    if (!parse_value(line.substr(vstart, i - vstart), &v))
      return line_error(line_no, "the value is not a number");
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i < line.size()) {
      size_t tstart = i;
      if (line[i] == '-') ++i;
      size_t digits = i;
      while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
      if (i == digits || i - tstart > 20) return line_error(line_no, "a bad timestamp");
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (i < line.size()) return line_error(line_no, "something after the timestamp");
    }
    if (metric != name) continue;
    if (!std::isfinite(v)) return line_error(line_no, std::string(name) + " is not finite");
    sum += v;
    found = true;
  }
  if (!found) return make_error("no sample of " + std::string(name));
  if (!std::isfinite(sum)) return make_error(std::string(name) + " sums to an infinity");
  return sum;
}

}  // namespace weft
