#include "controlplane/usage/agent_asks.h"

#include <algorithm>

#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;

void AgentAsks::usage(std::map<MachineId, UsageRequest> asks, uint64_t timeout_us, Done done) {
  const uint64_t id = ++next_;
  Pending& p = pending_[id];
  p.done = std::move(done);
  std::vector<std::pair<MachineId, rpc::Session*>> calls;
  for (auto& [m, req] : asks) {
    p.asked.insert(req.tasks.begin(), req.tasks.end());
    rpc::Session* s = agent_ ? agent_(m) : nullptr;
    if (!s) {
      p.answer.silent.push_back(m);
      continue;
    }
    p.waiting.insert(m);
    calls.emplace_back(m, s);
  }
  if (p.waiting.empty()) return finish(id);
  auto d = loop_.add_timer_in(timeout_us, [this, id] { finish(id); });
  if (d.ok()) p.deadline = std::move(d).value();
  // Every call is made before any answer can end the ask (an answer may come at once).
  for (auto& [m, s] : calls) {
    MachineId machine = m;
    s->call("task.usage", to_json(asks.at(m)),
            [this, id, machine](Result<json> r) { answered(id, machine, std::move(r)); });
  }
}

void AgentAsks::answered(uint64_t id, MachineId m, Result<json> r) {
  auto it = pending_.find(id);
  if (it == pending_.end() || !it->second.waiting.count(m)) return;  // ended, or twice
  Pending& p = it->second;
  auto usage = r.ok() ? parse_usage_report(*r) : Result<UsageReport>(std::move(r).error());
  if (usage.ok()) {
    p.waiting.erase(m);
    p.answer.interval_ms = std::max(p.answer.interval_ms, usage->interval_ms);
    for (auto& [task, u] : usage->tasks)
      if (p.asked.count(task)) p.answer.tasks[task] = u;
    for (auto& [task, e] : usage->scrape_errors)
      if (p.asked.count(task)) p.answer.scrape_errors[task] = e;
  } else {
    p.waiting.erase(m);
    p.answer.silent.push_back(m);
    log_warn("an agent's task.usage answer was refused", {{"ERROR", usage.error().str()}});
  }
  if (p.waiting.empty()) finish(id);
}

void AgentAsks::finish(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  for (MachineId m : p.waiting) p.answer.silent.push_back(m);  // not answered in time
  std::sort(p.answer.silent.begin(), p.answer.silent.end());
  p.done(std::move(p.answer));
}

void AgentAsks::call(MachineId m, const std::string& method, json params, uint64_t timeout_us,
                     rpc::ReplyFn reply) {
  rpc::Session* s = agent_ ? agent_(m) : nullptr;
  if (!s)
    return reply(make_error("the machine's agent is not connected").with_code(rpc::kUnavailable));
  const uint64_t id = ++next_;
  Call& c = calls_[id];
  c.reply = std::move(reply);
  auto d = loop_.add_timer_in(timeout_us, [this, id, method] {
    called(id, make_error("the machine's agent did not answer " + method + " in time")
                   .with_code(rpc::kTimeout));
  });
  if (d.ok()) c.deadline = std::move(d).value();
  s->call(method, std::move(params), [this, id](Result<json> r) { called(id, std::move(r)); });
}

void AgentAsks::called(uint64_t id, Result<json> r) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;  // answered already (or timed out)
  Call c = std::move(it->second);
  calls_.erase(it);
  c.reply(std::move(r));
}

}  // namespace weft::cp
