// Logging: structured fields to journald when stderr is connected to the journal
// (systemd sets $JOURNAL_STREAM), a readable line on stderr otherwise.
//
//   log_info("task started", {{"TASK_ID", id}, {"PID", std::to_string(pid)}});
//
// Field names follow journald rules (upper case, digits, underscore); they are
// prefixed with WEFT_ in the journal so `journalctl WEFT_TASK_ID=...` finds them.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

namespace weft {

enum class LogLevel { kDebug = 7, kInfo = 6, kNotice = 5, kWarning = 4, kError = 3 };

using LogField = std::pair<const char*, std::string>;

void log_set_level(LogLevel min);
// "debug", "info", "warning" or "error"; false (and no change) for anything else.
bool log_set_level_name(const std::string& name);
bool log_level_name_valid(const std::string& name);
void log_set_ident(std::string ident);
void log_msg(LogLevel level, const std::string& msg, std::initializer_list<LogField> fields = {});

inline void log_debug(const std::string& m, std::initializer_list<LogField> f = {}) {
  log_msg(LogLevel::kDebug, m, f);
}
inline void log_info(const std::string& m, std::initializer_list<LogField> f = {}) {
  log_msg(LogLevel::kInfo, m, f);
}
inline void log_warn(const std::string& m, std::initializer_list<LogField> f = {}) {
  log_msg(LogLevel::kWarning, m, f);
}
inline void log_error(const std::string& m, std::initializer_list<LogField> f = {}) {
  log_msg(LogLevel::kError, m, f);
}

}  // namespace weft
