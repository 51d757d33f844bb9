#include "agent/service_interest.h"

#include "common/job_spec.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "common/strings.h"

namespace weft::agent {

ServiceInterest::ServiceInterest(EventLoop& loop, ServiceCatalog& catalog, Ask ask,
                                 std::function<void()> answered)
    : loop_(loop), catalog_(catalog), ask_(std::move(ask)), answered_(std::move(answered)) {}

bool ServiceInterest::must_wait(const std::string& job) {
  if (waiting_.count(job)) return true;
  if (jobs_.count(job)) return false;
  // A name no job can have is not asked about (it would spoil the call it joins); past
  // the bound, new names are answered from what the agent holds.
  if (!valid_job_name(job) || jobs_.size() >= kMaxJobs) return false;
  jobs_.insert(job);
  waiting_.insert(job);
  to_ask_.push_back(job);
  if (!flush_.active()) {
    auto d = loop_.add_defer([this] {
      flush_.reset();
      flush();
    });
    if (d.ok()) {
      flush_ = std::move(d).value();
    } else {
      flush();
      return waiting_.count(job) > 0;
    }
  }
  return true;
}

void ServiceInterest::flush() {
  std::vector<std::string> jobs = std::move(to_ask_);
  to_ask_.clear();
  if (jobs.empty()) return;
  bool sent = ask_ && ask_(jobs, [this, jobs](Result<nlohmann::json> r) { on_reply(jobs, r); });
  if (!sent) {
    // No control plane now: the names are given when the agent registers; the queries
    // are answered from the copy.
    for (const auto& j : jobs) waiting_.erase(j);
    if (answered_) answered_();
  }
}

void ServiceInterest::on_reply(const std::vector<std::string>& jobs, Result<nlohmann::json> r) {
  if (r.ok()) {
    auto u = parse_service_update(*r);
    if (u.ok()) {
      // Only the jobs asked for: an answer cannot reset the copy or bring others.
      u->reset = false;
      std::erase_if(u->services, [&](const auto& e) { return !jobs_.count(ascii_lower(e.first)); });
      u->version = catalog_.version();  // the pushes say which version the copy is at
      catalog_.apply(*u);
    } else {
      log_warn("the control plane's answer to service.interest is not an update",
               {{"ERROR", u.error().str()}});
    }
  } else if (r.error().code != rpc::kUnavailable) {
    // A control plane before interest does not know the method: it tells this agent of
    // every job anyway (it ignored discovery_interest).
    log_info("service.interest not taken", {{"ERROR", r.error().str()}});
  }
  for (const auto& j : jobs) waiting_.erase(j);
  if (answered_) answered_();
}

}  // namespace weft::agent
