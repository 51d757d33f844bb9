#include "controlplane/taskcontrol/control_rounds.h"

#include "common/clock.h"

namespace weft::cp {

using json = nlohmann::json;

ControlRounds::ControlRounds(EventLoop& loop, Scheduler& sched, const Allocator& alloc,
                             const Maintenance& maintenance, Hooks hooks)
    : loop_(loop),
      sched_(sched),
      alloc_(alloc),
      maintenance_(maintenance),
      hooks_(std::move(hooks)) {
  links_ = std::make_unique<TaskControlLinks>(
      loop_,
      TaskControlLinks::Hooks{
          [this](const std::string& job) { return plan(job); },
          [this](const std::string& job, const std::vector<std::string>& acks) {
            acked(job, acks);
          },
          [this](const std::string& job, bool unreachable) { reachability(job, unreachable); }});
}

void ControlRounds::start(bool use_tls, std::shared_ptr<tls::Context> tls) {
  if (use_tls) links_->set_tls(std::move(tls));
  round();
}

void ControlRounds::round() {
  std::map<std::string, TaskControllerSpec> jobs;
  for (const auto& name : sched_.operations().controlled_jobs())
    if (auto j = sched_.job(name); j && j->controller) {
      jobs[name] = *j->controller;
      // A controller that is a task of another job: where that job's first ready task
      // runs now (a new address when it moves: a new link).
      if (!j->controller->job.empty()) jobs[name].address = hooks_.address(*j->controller);
    }
  links_->sync(jobs);
  std::erase_if(completed_, [&](const auto& e) { return !jobs.count(e.first); });
  uint64_t now = now_monotonic_us();
  links_->check(now);
  for (const auto& [name, spec] : jobs) links_->ask(name, now);
  auto t = loop_.add_timer_in(1'000'000, [this] { round(); });
  if (t.ok()) timer_ = std::move(t).value();
}

void ControlRounds::ask(const std::string& job) {
  if (links_->has(job)) links_->ask(job, now_monotonic_us());
}

json ControlRounds::plan(const std::string& job) {
  auto& completed = completed_[job];
  for (auto& id : sched_.operations().take_completed(job)) completed.push_back(std::move(id));
  return build_plan(job, sched_, alloc_, maintenance_, completed);
}

void ControlRounds::acked(const std::string& job, const std::vector<std::string>& acks) {
  completed_.erase(job);  // the controller has been told
  hooks_.granted(job, acks, sched_.operations().grant(job, acks, now_monotonic_us()));
}

void ControlRounds::reachability(const std::string& job, bool unreachable) {
  auto spec = sched_.job(job);
  if (!spec || !spec->controller || spec->controller->wait_when_unreachable) return;
  hooks_.apply(sched_.operations().set_control_fallback(job, unreachable, now_monotonic_us()));
}

std::string controller_address(const Scheduler& sched, const MachineSessions& sessions,
                               const TaskControllerSpec& c) {
  for (const auto& t : sched.tasks().of_job(c.job)) {
    if (!available(t)) continue;
    rpc::Session* s = sessions.agent(t.machine);
    if (!s) continue;
    const rpc::Peer& peer = s->peer();
    // An agent on this host (a Unix socket) serves on loopback.
    std::string host = peer.is_unix || peer.host.empty() ? "127.0.0.1" : peer.host;
    if (host.find(':') != std::string::npos) host = "[" + host + "]";
    return host + ":" + std::to_string(c.port);
  }
  return "";  // none ready: unreachable until one is
}

}  // namespace weft::cp
