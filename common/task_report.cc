#include "common/task_report.h"

#include <openssl/evp.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <type_traits>

#include "common/fs.h"
#include "common/strings.h"

namespace weft {

namespace {

constexpr size_t kDigestHex = 32;

void entry_words(std::string_view id, std::string_view state, uint64_t* a, uint64_t* b) {
  std::string line;
  line.reserve(id.size() + 1 + state.size());
  line.append(id).append(1, ' ').append(state);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(line.data(), line.size(), md, &len, EVP_sha256(), nullptr) != 1 || len < 16) {
    *a = *b = 0;  // not reached with OpenSSL's SHA-256; a zero entry only weakens the check
    return;
  }
  *a = *b = 0;
  for (int i = 7; i >= 0; --i) *a = (*a << 8) | md[i];
  for (int i = 15; i >= 8; --i) *b = (*b << 8) | md[i];
}

}  // namespace

void TaskDigest::add(std::string_view id, std::string_view state) {
  uint64_t a, b;
  entry_words(id, state, &a, &b);
  a_ += a;
  b_ += b;
}

void TaskDigest::remove(std::string_view id, std::string_view state) {
  uint64_t a, b;
  entry_words(id, state, &a, &b);
  a_ -= a;
  b_ -= b;
}

std::string TaskDigest::hex() const {
  char out[kDigestHex + 1];
  std::snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(a_),
                static_cast<unsigned long long>(b_));
  return out;
}

std::string tasks_digest(const std::map<std::string, std::string>& states) {
  TaskDigest d;
  for (const auto& [id, state] : states) d.add(id, state);
  return d.hex();
}

std::string tasks_digest(const TaskList& tasks) {
  TaskDigest d;
  for (const auto& [id, state] : tasks) d.add(id, task_state_name(state));
  return d.hex();
}

namespace {

namespace od = simdjson::ondemand;

bool is_digest(std::string_view v) {
  return v.size() == kDigestHex && v.find_first_not_of("0123456789abcdef") == std::string::npos;
}

Error malformed() {
  return field_error("params", "must be a JSON object (the report could not be read)");
}

// "tasks" or "changes": task id -> state (or, for changes, null), sorted by id; a task
// named twice is refused.
template <typename List>
Status read_list(od::value v, const char* field, List* out) {
  constexpr bool nulls = std::is_same_v<List, TaskChanges>;
  od::object obj;
  if (v.get_object().get(obj))
    return field_error(field, nulls ? "must be an object of task id -> state or null"
                                    : "must be an object of task id -> state");
  for (auto member : obj) {
    od::field f;
    std::string_view id;
    if (std::move(member).get(f) || f.unescaped_key().get(id)) return malformed();
    if (out->size() >= kMaxReportedTasks)
      return field_error(field, "more than " + std::to_string(kMaxReportedTasks) + " tasks");
    od::value value = f.value();
    if constexpr (nulls) {
      bool null = false;
      if (value.is_null().get(null)) return malformed();
      if (null) {
        out->emplace_back(std::string(id), std::nullopt);
        continue;
      }
    }
    std::string_view name;
    std::optional<TaskState> state;
    if (!value.get_string().get(name)) state = parse_task_state(std::string(name));
    if (!state)
      return field_error(std::string(field) + "." + std::string(id),
                         nulls ? "must be a task state (common/task_state.h) or null"
                               : "must be a task state (common/task_state.h)");
    out->emplace_back(std::string(id), *state);
  }
  std::sort(out->begin(), out->end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  auto twice = std::adjacent_find(out->begin(), out->end(),
                                  [](const auto& x, const auto& y) { return x.first == y.first; });
  if (twice != out->end())
    return field_error(std::string(field) + "." + twice->first, "names the task twice");
  return {};
}

Status read_failures(od::value v, TaskFailures* out) {
  od::object obj;
  if (v.get_object().get(obj))
    return field_error("failures", "must be an object of task id -> {reason, setup}");
  for (auto member : obj) {
    od::field f;
    std::string_view key;
    if (std::move(member).get(f) || f.unescaped_key().get(key)) return malformed();
    std::string id(key);
    if (out->size() >= kMaxReportedTasks)
      return field_error("failures", "more than " + std::to_string(kMaxReportedTasks) + " tasks");
    std::string at = "failures." + id.substr(0, 200);
    od::object one;
    if (f.value().get_object().get(one))
      return field_error(at, "must be an object {reason, setup}");
    TaskFailure tf;
    bool reason = false;
    for (auto inner : one) {
      od::field g;
      std::string_view k;
      if (std::move(inner).get(g) || g.unescaped_key().get(k)) return malformed();
      if (k == "reason") {
        std::string_view text;
        if (g.value().get_string().get(text))
          return field_error(at + ".reason", "must be a string");
        // A note, not state: a longer one is cut (on a character boundary), not refused.
        tf.reason = utf8_prefix(std::string(text), kMaxFailureReason);
        reason = true;
      } else if (k == "setup") {
        if (g.value().get_bool().get(tf.setup))
          return field_error(at + ".setup", "must be true or false");
      }
    }
    if (!reason) return field_error(at + ".reason", "must be a string");
    if (!out->emplace(std::move(id), std::move(tf)).second)
      return field_error(at, "names the task twice");
  }
  return {};
}

}  // namespace

Result<TaskReport> parse_task_report(std::string_view text) {
  thread_local od::parser parser;
  simdjson::padded_string padded(text);
  od::document doc;
  od::object obj;
  if (parser.iterate(padded).get(doc)) return malformed();
  if (doc.get_object().get(obj)) return field_error("params", "must be an object");
  TaskReport r;
  std::optional<std::string> base, digest;
  std::set<std::string, std::less<>> seen;
  for (auto member : obj) {
    od::field f;
    std::string_view key;
    if (std::move(member).get(f) || f.unescaped_key().get(key)) return malformed();
    bool known = key == "machine" || key == "tasks" || key == "changes" || key == "base" ||
                 key == "digest" || key == "failures";
    if (!known) continue;  // skipped unread
    if (!seen.emplace(key).second) return field_error(std::string(key), "is given twice");
    od::value v = f.value();
    if (key == "machine") {
      std::string_view m;
      if (v.get_string().get(m)) return field_error("machine", "the machine id is required");
      r.machine = m;
    } else if (key == "tasks") {
      TaskList list;
      TRY(read_list(v, "tasks", &list));
      r.tasks = std::move(list);
    } else if (key == "changes") {
      TaskChanges list;
      TRY(read_list(v, "changes", &list));
      r.changes = std::move(list);
    } else if (key == "failures") {
      TRY(read_failures(v, &r.failures));
    } else {
      // Checked below by what the report is (a whole list needs neither).
      std::string_view d;
      (key == "base" ? base : digest) = v.get_string().get(d) ? std::string() : std::string(d);
    }
  }
  if (r.tasks) {
    r.changes.reset();
    r.base.clear();
    r.digest = tasks_digest(*r.tasks);
    return r;
  }
  if (r.changes) {
    if (!base || !is_digest(*base))
      return field_error("base",
                         "must be the acknowledged list's digest (32 lowercase hex digits)");
    if (!digest || !is_digest(*digest))
      return field_error("digest", "must be the new list's digest (32 lowercase hex digits)");
    r.base = std::move(*base);
    r.digest = std::move(*digest);
    return r;
  }
  if (!digest)
    return field_error("tasks", "is required (or \"digest\" when the list is unchanged)");
  if (!is_digest(*digest)) return field_error("digest", "must be 32 lowercase hex digits");
  r.digest = std::move(*digest);
  return r;
}

std::string report_machine(std::string_view text) {
  thread_local od::parser parser;
  simdjson::padded_string padded(text);
  od::document doc;
  od::object obj;
  std::string_view m;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj) ||
      obj.find_field_unordered("machine").get_string().get(m))
    return "";
  return std::string(m);
}

Result<TaskReport> parse_task_report(const nlohmann::json& p) {
  if (!p.is_object()) return field_error("params", "must be an object");
  return parse_task_report(
      std::string_view(p.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
}

TaskChanges apply_task_changes(TaskList& list, TaskDigest& digest, const TaskChanges& changes) {
  TaskChanges applied;
  auto by_id = [](const auto& entry, const std::string& id) { return entry.first < id; };
  for (const auto& [id, state] : changes) {
    auto it = std::lower_bound(list.begin(), list.end(), id, by_id);
    bool held = it != list.end() && it->first == id;
    if (held) digest.remove(id, task_state_name(it->second));
    if (!state) {
      if (held) {
        list.erase(it);
        applied.emplace_back(id, std::nullopt);
      }
      continue;
    }
    digest.add(id, task_state_name(*state));
    if (held)
      it->second = *state;
    else
      list.emplace(it, id, *state);
    applied.emplace_back(id, state);
  }
  return applied;
}

nlohmann::json task_changes_json(const std::map<std::string, std::string>& acked,
                                 const std::map<std::string, std::string>& now) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [id, state] : acked)
    if (!now.count(id)) out[id] = nullptr;
  for (const auto& [id, state] : now)
    if (auto it = acked.find(id); it == acked.end() || it->second != state) out[id] = state;
  return out;
}

}  // namespace weft
