#include "controlplane/discovery/service_watches.h"

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/rpc/protocol.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {
constexpr size_t kMaxServiceWatchers = 1024;
constexpr uint64_t kMaxWatchUs = 60'000'000;
constexpr uint64_t kExpiryCheckUs = 1'000'000;
}  // namespace

json ServiceWatches::answer(const std::string& job) const {
  json out{{"index", table_.version()}};
  if (!job.empty()) {
    const Service* s = table_.find(job);
    out["job"] = job;
    out["index"] = table_.changed_at(job);
    out["service"] = s ? to_json(*s) : json();
    return out;
  }
  json all = json::object();
  for (const auto& [name, s] : table_.services()) all[name] = to_json(s);
  out["services"] = std::move(all);
  return out;
}

Result<json> ServiceWatches::watch(const json& p, const rpc::CallContext& c) {
  if (!p.is_object()) return field_error("params", "must be an object");
  std::string job;
  if (p.contains("job")) {
    if (!p["job"].is_string()) return field_error("job", "must be a job's name");
    job = p["job"].get<std::string>();
  }
  uint64_t index = 0;
  if (p.contains("index")) {
    if (!p["index"].is_number_unsigned()) return field_error("index", "must be an index");
    index = p["index"].get<uint64_t>();
  }
  // Bounded before it is multiplied (a huge wait_ms would wrap past the bound).
  TRY_ASSIGN(const int64_t wait_ms,
             int_member(p, "wait_ms", 30'000, 0, static_cast<int64_t>(kMaxWatchUs / 1000)));
  const uint64_t wait_us = static_cast<uint64_t>(wait_ms) * 1000;
  uint64_t changed = job.empty() ? table_.version() : table_.changed_at(job);
  if (changed > index || wait_us == 0 || !c.session) return answer(job);
  if (watchers_.size() >= kMaxServiceWatchers)
    return make_error("too many service watches; try again").with_code(rpc::kUnavailable);
  // The scheduler's clock (monotonic), as the held stops' deadlines.
  watchers_.push_back(Watcher{c.session->defer_reply(), job, index, now_monotonic_us() + wait_us});
  if (!armed_) {
    armed_ = true;
    auto t = loop_.add_timer_in(kExpiryCheckUs, [this] { expire(); });
    if (t.ok()) timer_ = std::move(t).value();
  }
  return json();
}

void ServiceWatches::answer_due(bool changed) {
  uint64_t now = now_monotonic_us();
  std::vector<Watcher> keep;
  for (auto& w : watchers_) {
    uint64_t at = w.job.empty() ? table_.version() : table_.changed_at(w.job);
    if ((changed && at > w.index) || now >= w.deadline_us)
      w.reply(answer(w.job));
    else
      keep.push_back(std::move(w));
  }
  watchers_ = std::move(keep);
}

void ServiceWatches::table_changed() {
  answer_due(true);
}

void ServiceWatches::expire() {
  armed_ = false;
  answer_due(false);
  if (!watchers_.empty()) {
    armed_ = true;
    auto t = loop_.add_timer_in(kExpiryCheckUs, [this] { expire(); });
    if (t.ok()) timer_ = std::move(t).value();
  }
}

}  // namespace weft::cp
