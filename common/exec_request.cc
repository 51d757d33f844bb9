#include "common/exec_request.h"

#include <cctype>

namespace weft {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxCommandArgs = 256;
constexpr size_t kMaxCommandBytes = 64 * 1024;

bool term_ok(const std::string& t) {
  if (t.empty() || t.size() > 64) return false;
  for (char c : t)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '+')
      return false;
  return true;
}

}  // namespace

Result<uint16_t> exec_dimension(const json& p, const char* name, uint16_t dflt) {
  if (!p.contains(name)) return dflt;
  const json& v = p[name];
  if (!v.is_number_unsigned() || v.get<uint64_t>() < 1 || v.get<uint64_t>() > 1000)
    return field_error(name, "must be a whole number from 1 to 1000");
  return static_cast<uint16_t>(v.get<uint64_t>());
}

Result<ExecRequest> parse_exec_request(const json& p) {
  if (!p.is_object()) return make_error("params must be an object");
  ExecRequest r;
  if (!p.contains("id") || !p["id"].is_string() || p["id"].get<std::string>().empty() ||
      p["id"].get<std::string>().size() > 256)
    return field_error("id", "is required: the task's id");
  r.task = p["id"].get<std::string>();
  if (!p.contains("command") || !p["command"].is_array() || p["command"].empty() ||
      p["command"].size() > kMaxCommandArgs)
    return field_error("command", "is required: the program and its arguments (at most 256)");
  size_t bytes = 0;
  for (const json& a : p["command"]) {
    if (!a.is_string()) return field_error("command", "must be a list of strings");
    const auto& s = a.get_ref<const std::string&>();
    if (s.find('\0') != std::string::npos)
      return field_error("command", "must not hold a NUL character");
    bytes += s.size() + 1;
    r.command.push_back(s);
  }
  if (r.command[0].empty()) return field_error("command", "must name a program first");
  if (bytes > kMaxCommandBytes) return field_error("command", "is longer than 64 KiB");
  if (p.contains("tty")) {
    if (!p["tty"].is_boolean()) return field_error("tty", "must be true or false");
    r.options.tty = p["tty"].get<bool>();
  }
  TRY_ASSIGN(r.options.rows, exec_dimension(p, "rows", 24));
  TRY_ASSIGN(r.options.cols, exec_dimension(p, "cols", 80));
  if (p.contains("term")) {
    if (!p["term"].is_string() || !term_ok(p["term"].get<std::string>()))
      return field_error("term", "must be a terminal type such as xterm-256color");
    r.term = p["term"].get<std::string>();
  }
  return r;
}

json exec_request_json(const ExecRequest& r) {
  json p{{"id", r.task}, {"command", r.command}, {"tty", r.options.tty}};
  if (r.options.tty) {
    p["rows"] = r.options.rows;
    p["cols"] = r.options.cols;
    if (!r.term.empty()) p["term"] = r.term;
  }
  return p;
}

}  // namespace weft
