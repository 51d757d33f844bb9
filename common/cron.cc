#include "common/cron.h"

#include <algorithm>

#include <cctype>
#include <ctime>
#include <vector>

namespace weft {

namespace {

struct Field {
  const char* name;
  int lo, hi;
  const char* const* names;  // names for lo.. (months, weekdays), or null
  int names_from;
};

const char* const kMonths[] = {"jan", "feb", "mar", "apr", "may", "jun",  "jul",
                               "aug", "sep", "oct", "nov", "dec", nullptr};
const char* const kWeekdays[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat", nullptr};

std::vector<std::string_view> cron_split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(sep, start);
    out.push_back(
        s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

Result<int> value(std::string_view v, const Field& f) {
  if (f.names && v.size() == 3) {
    for (int i = 0; f.names[i]; ++i) {
      bool same = true;
      for (size_t k = 0; k < 3; ++k)
        same = same && std::tolower(static_cast<unsigned char>(v[k])) == f.names[i][k];
      if (same) return f.names_from + i;
    }
  }
  if (v.empty() || v.size() > 4)
    return make_error(std::string(f.name) + ": '" + std::string(v.substr(0, 16)) +
                      "' is not a number");
  int n = 0;
  for (char c : v) {
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return make_error(std::string(f.name) + ": '" + std::string(v) + "' is not a number");
    n = n * 10 + (c - '0');
  }
  if (n < f.lo || n > f.hi)
    return make_error(std::string(f.name) + ": " + std::to_string(n) + " is out of range " +
                      std::to_string(f.lo) + "-" + std::to_string(f.hi));
  return n;
}

// Sets the values the field's text names; `any`: it was "*" (or "*/1").
template <size_t N>
Status parse_field(std::string_view text, const Field& f, std::bitset<N>* bits, bool* any) {
  if (text.empty()) return make_error(std::string(f.name) + ": is empty");
  *any = text == "*" || text == "*/1";
  auto items = cron_split(text, ',');
  if (items.size() > 60) return make_error(std::string(f.name) + ": too many items");
  for (std::string_view item : items) {
    int step = 1;
    bool has_step = false;
    if (size_t slash = item.find('/'); slash != std::string_view::npos) {
      std::string_view s = item.substr(slash + 1);
      Field steps{f.name, 1, f.hi - f.lo + 1, nullptr, 0};
      auto st = value(s, steps);
      if (!st.ok())
        return make_error(std::string(f.name) + ": a step must be 1-" +
                          std::to_string(f.hi - f.lo + 1));
      step = *st;
      has_step = true;
      item = item.substr(0, slash);
    }
    int from = f.lo, to = f.hi;
    if (item == "*") {
    } else if (size_t dash = item.find('-'); dash != std::string_view::npos) {
      TRY_ASSIGN(from, value(item.substr(0, dash), f));
      TRY_ASSIGN(to, value(item.substr(dash + 1), f));
      if (to < from)
        return make_error(std::string(f.name) + ": the range " + std::string(item) +
                          " runs backwards");
    } else {
      TRY_ASSIGN(from, value(item, f));
      to = has_step ? f.hi : from;  // "N/STEP" runs from N to the field's end
    }
    for (int v = from; v <= to; v += step) bits->set(static_cast<size_t>(v));
  }
  return {};
}

std::string_view macro(std::string_view m) {
  if (m == "@yearly" || m == "@annually") return "0 0 1 1 *";
  if (m == "@monthly") return "0 0 1 * *";
  if (m == "@weekly") return "0 0 * * 0";
  if (m == "@daily" || m == "@midnight") return "0 0 * * *";
  if (m == "@hourly") return "0 * * * *";
  return {};
}

}  // namespace

Result<CronSchedule> parse_cron(std::string_view text) {
  if (text.size() > 256) return make_error("a schedule has at most 256 characters");
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (!text.empty() && text.front() == '@') {
    std::string_view expanded = macro(text);
    if (expanded.empty())
      return make_error("'" + std::string(text) +
                        "' is not one of @hourly, @daily, @midnight, @weekly, @monthly, "
                        "@yearly, @annually");
    text = expanded;
  }
  std::vector<std::string_view> fields;
  for (std::string_view f : cron_split(text, ' '))
    if (!f.empty()) fields.push_back(f);
  if (fields.size() != 5 && fields.size() != 6)
    return make_error(
        "must have five fields (minute hour day-of-month month day-of-week) or six (seconds "
        "first), or be a macro such as @hourly");
  CronSchedule c;
  size_t i = 0;
  bool any = false;
  if (fields.size() == 6) {
    TRY(parse_field(fields[i++], Field{"second", 0, 59, nullptr, 0}, &c.seconds, &any));
  } else {
    c.seconds.set(0);
  }
  TRY(parse_field(fields[i++], Field{"minute", 0, 59, nullptr, 0}, &c.minutes, &any));
  TRY(parse_field(fields[i++], Field{"hour", 0, 23, nullptr, 0}, &c.hours, &any));
  TRY(parse_field(fields[i++], Field{"day-of-month", 1, 31, nullptr, 0}, &c.days, &c.days_any));
  TRY(parse_field(fields[i++], Field{"month", 1, 12, kMonths, 1}, &c.months, &any));
  std::bitset<8> wd;
  TRY(parse_field(fields[i++], Field{"day-of-week", 0, 7, kWeekdays, 0}, &wd, &c.weekdays_any));
  for (size_t d = 0; d < 7; ++d) c.weekdays[d] = wd[d];
  if (wd[7]) c.weekdays.set(0);  // 7 is Sunday too
  if (!c.next_after(0))
    return make_error("'" + std::string(text) + "' names no date (such as February 30)");
  return c;
}

int64_t CronSchedule::shortest_gap() const {
  int64_t first = -1, last = -1, gap = 86400;
  for (int64_t h = 0; h < 24; ++h) {
    if (!hours[static_cast<size_t>(h)]) continue;
    for (int64_t m = 0; m < 60; ++m) {
      if (!minutes[static_cast<size_t>(m)]) continue;
      for (int64_t sec = 0; sec < 60; ++sec) {
        if (!seconds[static_cast<size_t>(sec)]) continue;
        const int64_t t = h * 3600 + m * 60 + sec;
        if (last >= 0) gap = std::min(gap, t - last);
        if (first < 0) first = t;
        last = t;
      }
    }
  }
  if (first >= 0) gap = std::min(gap, 86400 - last + first);
  return gap;
}

std::optional<int64_t> CronSchedule::next_after(int64_t after) const {
  if (after < 0 || after > (int64_t{1} << 40)) return std::nullopt;
  time_t t = static_cast<time_t>(after + 1);
  const time_t limit = t + 10LL * 366 * 86400;
  std::tm tm{};
  gmtime_r(&t, &tm);
  auto normalise = [&] {
    tm.tm_isdst = 0;
    t = timegm(&tm);
    gmtime_r(&t, &tm);
  };
  while (t <= limit) {
    if (!months[static_cast<size_t>(tm.tm_mon + 1)]) {
      tm.tm_mon += 1, tm.tm_mday = 1, tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
      normalise();
      continue;
    }
    bool dom = days[static_cast<size_t>(tm.tm_mday)];
    bool dow = weekdays[static_cast<size_t>(tm.tm_wday)];
    bool day = days_any || weekdays_any ? dom && dow : dom || dow;
    if (!day) {
      tm.tm_mday += 1, tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
      normalise();
      continue;
    }
    if (!hours[static_cast<size_t>(tm.tm_hour)]) {
      tm.tm_hour += 1, tm.tm_min = tm.tm_sec = 0;
      normalise();
      continue;
    }
    if (!minutes[static_cast<size_t>(tm.tm_min)]) {
      tm.tm_min += 1, tm.tm_sec = 0;
      normalise();
      continue;
    }
    if (!seconds[static_cast<size_t>(tm.tm_sec)]) {
      tm.tm_sec += 1;
      normalise();
      continue;
    }
    return static_cast<int64_t>(t);
  }
  return std::nullopt;
}

}  // namespace weft
