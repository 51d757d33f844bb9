#include "agent/service_interest.h"

#include <algorithm>

#include "common/clock.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "common/strings.h"

namespace weft::agent {

ServiceInterest::ServiceInterest(EventLoop& loop, ServiceCatalog& catalog, Ask ask,
                                 std::function<void()> answered, Options opts)
    : loop_(loop),
      catalog_(catalog),
      ask_(std::move(ask)),
      answered_(std::move(answered)),
      opts_(opts) {
  auto t = loop_.add_timer_in(opts_.sweep_us, [this] { sweep(); });
  if (t.ok()) sweep_ = std::move(t).value();
}

std::vector<std::string> ServiceInterest::jobs() const {
  std::vector<std::string> out;
  out.reserve(asked_.size());
  for (const auto& [job, at] : asked_) out.push_back(job);
  return out;
}

bool ServiceInterest::must_wait(const std::string& job) {
  const uint64_t now = now_monotonic_us();
  if (auto it = asked_.find(job); it != asked_.end()) {
    it->second = now;
    return waiting_.count(job) > 0;
  }
  // A name no job can have is not asked about (it would spoil the call it joins).
  if (!valid_job_name(job) || opts_.max_jobs == 0) return false;
  if (asked_.size() >= opts_.max_jobs) {
    // The least recently asked name that is not being asked makes room; when every one
    // is, the query is answered from what the agent holds.
    auto oldest = asked_.end();
    for (auto it = asked_.begin(); it != asked_.end(); ++it)
      if (!waiting_.count(it->first) && (oldest == asked_.end() || it->second < oldest->second))
        oldest = it;
    if (oldest == asked_.end()) return false;
    forget(oldest->first);
  }
  asked_.emplace(job, now);
  waiting_.insert(job);
  to_ask_.push_back(job);
  schedule_flush();
  return waiting_.count(job) > 0;  // a flush without a control plane answers at once
}

void ServiceInterest::forget(std::string job) {
  // (Never one being asked: a name waiting for its answer is neither stale nor evicted.)
  asked_.erase(job);
  catalog_.forget(job);
  to_forget_.push_back(std::move(job));
  ++forgotten_;
}

void ServiceInterest::sweep() {
  const uint64_t now = now_monotonic_us();
  std::vector<std::string> stale;
  for (const auto& [job, at] : asked_)
    if (!waiting_.count(job) && now - at >= opts_.forget_after_us) stale.push_back(job);
  for (const auto& job : stale) forget(job);
  if (!to_forget_.empty()) schedule_flush();
  auto t = loop_.add_timer_in(opts_.sweep_us, [this] { sweep(); });
  if (t.ok()) sweep_ = std::move(t).value();
}

void ServiceInterest::filter(ServiceUpdate& u) const {
  if (everything_pushed_) return;
  std::erase_if(u.services, [&](const auto& e) { return !asked_.count(ascii_lower(e.first)); });
}

void ServiceInterest::schedule_flush() {
  loop_.defer_once(flush_, [this] { flush(); });
}

void ServiceInterest::flush() {
  std::vector<std::string> jobs = std::move(to_ask_), forget = std::move(to_forget_);
  to_ask_.clear();
  to_forget_.clear();
  if (jobs.empty() && forget.empty()) return;
  bool sent = ask_ && ask_(jobs, forget, [this, jobs](Result<nlohmann::json> r) {
                on_reply(jobs, std::move(r));
              });
  if (!sent) {
    // No control plane now: the names are given when the agent registers (a new
    // session starts from that list, so nothing forgotten needs saying); the queries
    // are answered from the copy.
    for (const auto& j : jobs) waiting_.erase(j);
    if (answered_ && !jobs.empty()) answered_();
  }
}

void ServiceInterest::on_reply(const std::vector<std::string>& jobs, Result<nlohmann::json> r) {
  if (r.ok()) {
    everything_pushed_ = false;
    auto u = parse_service_update(*r);
    if (u.ok()) {
      // Only the jobs asked for: an answer cannot reset the copy or bring others.
      u->reset = false;
      filter(*u);
      u->version = catalog_.version();  // the pushes say which version the copy is at
      catalog_.apply(*u);
    } else {
      log_warn("the control plane's answer to service.interest is not an update",
               {{"ERROR", u.error().str()}});
    }
  } else if (r.error().code != rpc::kUnavailable) {
    // A control plane before interest does not know the method: it tells this agent of
    // every job anyway (it ignored discovery_interest), and the pushes are kept whole.
    everything_pushed_ = true;
    log_info("service.interest not taken", {{"ERROR", r.error().str()}});
  }
  for (const auto& j : jobs) waiting_.erase(j);
  if (answered_ && !jobs.empty()) answered_();
}

}  // namespace weft::agent
