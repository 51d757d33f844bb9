#include "common/task_report.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

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

bool is_digest(const nlohmann::json& v) {
  return v.is_string() && v.get_ref<const std::string&>().size() == kDigestHex &&
         v.get_ref<const std::string&>().find_first_not_of("0123456789abcdef") == std::string::npos;
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

Status parse_failures(const nlohmann::json& p, TaskFailures* out) {
  auto f = p.find("failures");
  if (f == p.end()) return {};
  if (!f->is_object())
    return field_error("failures", "must be an object of task id -> {reason, setup}");
  if (f->size() > kMaxReportedTasks)
    return field_error("failures", "more than " + std::to_string(kMaxReportedTasks) + " tasks");
  for (const auto& [id, v] : f->items()) {
    std::string at = "failures." + id.substr(0, 200);
    if (!v.is_object()) return field_error(at, "must be an object {reason, setup}");
    TaskFailure tf;
    auto reason = v.find("reason");
    if (reason == v.end() || !reason->is_string())
      return field_error(at + ".reason", "must be a string");
    // A note, not state: a longer one is cut (on a character boundary), not refused.
    tf.reason = utf8_prefix(reason->get_ref<const std::string&>(), kMaxFailureReason);
    auto setup = v.find("setup");
    if (setup != v.end()) {
      if (!setup->is_boolean()) return field_error(at + ".setup", "must be true or false");
      tf.setup = setup->get<bool>();
    }
    (*out)[id] = std::move(tf);
  }
  return {};
}

}  // namespace

Result<TaskReport> parse_task_report(const nlohmann::json& p) {
  if (!p.is_object()) return field_error("params", "must be an object");
  TaskReport r;
  TRY(parse_failures(p, &r.failures));
  auto tasks = p.find("tasks");
  if (tasks != p.end()) {
    if (!tasks->is_object()) return field_error("tasks", "must be an object of task id -> state");
    if (tasks->size() > kMaxReportedTasks)
      return field_error("tasks", "more than " + std::to_string(kMaxReportedTasks) + " tasks");
    TaskList list;
    list.reserve(tasks->size());
    for (const auto& [id, st] : tasks->items()) {  // nlohmann's objects iterate in key order
      auto state = st.is_string() ? parse_task_state(st.get<std::string>()) : std::nullopt;
      if (!state) return field_error("tasks." + id, "must be a task state (common/task_state.h)");
      list.emplace_back(id, *state);
    }
    r.digest = tasks_digest(list);
    r.tasks = std::move(list);
    return r;
  }
  auto digest = p.find("digest");
  auto changes = p.find("changes");
  if (changes != p.end()) {
    if (!changes->is_object())
      return field_error("changes", "must be an object of task id -> state or null");
    if (changes->size() > kMaxReportedTasks)
      return field_error("changes", "more than " + std::to_string(kMaxReportedTasks) + " tasks");
    auto base = p.find("base");
    if (base == p.end() || !is_digest(*base))
      return field_error("base",
                         "must be the acknowledged list's digest (32 lowercase hex digits)");
    if (digest == p.end() || !is_digest(*digest))
      return field_error("digest", "must be the new list's digest (32 lowercase hex digits)");
    TaskChanges list;
    list.reserve(changes->size());
    for (const auto& [id, st] : changes->items()) {
      if (st.is_null()) {
        list.emplace_back(id, std::nullopt);
        continue;
      }
      auto state = st.is_string() ? parse_task_state(st.get<std::string>()) : std::nullopt;
      if (!state)
        return field_error("changes." + id, "must be a task state (common/task_state.h) or null");
      list.emplace_back(id, *state);
    }
    r.changes = std::move(list);
    r.base = base->get<std::string>();
    r.digest = digest->get<std::string>();
    return r;
  }
  if (digest == p.end())
    return field_error("tasks", "is required (or \"digest\" when the list is unchanged)");
  if (!is_digest(*digest)) return field_error("digest", "must be 32 lowercase hex digits");
  r.digest = digest->get<std::string>();
  return r;
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
