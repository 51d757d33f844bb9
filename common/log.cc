#include "common/log.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

namespace weft {
namespace {

LogLevel g_min = LogLevel::kInfo;
std::string g_ident = "weft";

// True when stderr is the journal stream systemd handed us ($JOURNAL_STREAM is
// "dev:inode" of that stream); then native journal fields are worth sending.
bool to_journal() {
  static int cached = -1;
  if (cached < 0) {
    cached = 0;
    if (const char* js = std::getenv("JOURNAL_STREAM")) {
      struct stat st;
      unsigned long long dev = 0, ino = 0;
      if (std::sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
          st.st_dev == dev && st.st_ino == ino) {
        cached = 1;
      }
    }
  }
  return cached == 1;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kNotice:
      return "notice";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

}  // namespace

void log_set_level(LogLevel min) {
  g_min = min;
}
void log_set_ident(std::string ident) {
  g_ident = std::move(ident);
}

static bool level_from_name(const std::string& name, LogLevel* out) {
  if (name == "debug")
    *out = LogLevel::kDebug;
  else if (name == "info")
    *out = LogLevel::kInfo;
  else if (name == "warning")
    *out = LogLevel::kWarning;
  else if (name == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

bool log_level_name_valid(const std::string& name) {
  LogLevel l;
  return level_from_name(name, &l);
}

bool log_set_level_name(const std::string& name) {
  LogLevel l;
  if (!level_from_name(name, &l)) return false;
  g_min = l;
  return true;
}

void log_msg(LogLevel level, const std::string& msg, std::initializer_list<LogField> fields) {
  if (static_cast<int>(level) > static_cast<int>(g_min)) return;
  if (to_journal()) {
    std::vector<std::string> items;
    items.push_back("MESSAGE=" + msg);
    items.push_back("PRIORITY=" + std::to_string(static_cast<int>(level)));
    items.push_back("SYSLOG_IDENTIFIER=" + g_ident);
    for (const auto& [k, v] : fields) items.push_back(std::string("WEFT_") + k + "=" + v);
    std::vector<iovec> iov;
    for (auto& s : items) iov.push_back({s.data(), s.size()});
    if (sd_journal_sendv(iov.data(), static_cast<int>(iov.size())) >= 0) return;
  }
  std::string line;
  char ts[32];
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  line += ts;
  line += " ";
  line += g_ident;
  line += " ";
  line += level_name(level);
  line += ": ";
  line += msg;
  for (const auto& [k, v] : fields) {
    line += " ";
    for (const char* p = k; *p; ++p) line += static_cast<char>(std::tolower(*p));
    line += "=";
    line += v;
  }
  line += "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace weft
