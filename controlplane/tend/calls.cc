#include "controlplane/tend/calls.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/clock.h"
#include "common/cp_link.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/oci.h"
#include "common/tls.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

TendCalls::TendCalls(const ShardParts& s)
    : cfg_(s.cfg),
      loop_(s.loop),
      model_(s.model),
      agent_asks_(s.agent_asks),
      audit_(s.audit),
      fx_(s.fx),
      gate_(s.gate) {}

Result<json> TendCalls::job_autoscale(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  std::string name = p["name"].get<std::string>();
  auto spec = model_.sched.job(name);
  if (!spec) return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  if (!spec->autoscale) return field_error("name", "job " + name + " does not autoscale");
  auto shown = autoscaling_ ? autoscaling_->show(name) : std::nullopt;
  if (!shown) return make_error("autoscaling is not running here").with_code(rpc::kUnavailable);
  return *shown;
}

Result<json> TendCalls::job_autoscale_pause(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required");
  if (!p.contains("paused") || !p["paused"].is_boolean())
    return field_error("paused", "is required: true to pause, false to resume");
  std::string name = p["name"].get<std::string>();
  auto spec = model_.sched.job(name);
  if (!spec) return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  TRY(gate_.may_change_jobs(gate_.caller(c), spec->entitlement_id));
  if (!spec->autoscale) return field_error("name", "job " + name + " does not autoscale");
  AutoscaleSpec a = *spec->autoscale;
  a.paused = p["paused"].get<bool>();
  TRY(model_.sched.set_autoscale(name, a));
  TRY(fx_.persist({name}, {}));
  return json{{"job", name}, {"paused", a.paused}};
}

Result<json> TendCalls::rebalance_plan(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the entitlement's name");
  auto id = model_.broker.entitlements().named(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  std::string planner = "local";
  if (p.contains("planner")) {
    if (!p["planner"].is_string() || (p["planner"] != "local" && p["planner"] != "exact"))
      return field_error("planner", "must be \"local\" (the default) or \"exact\"");
    planner = p["planner"].get<std::string>();
  }
  rebalance::Options o;
  // The plan is made on the loop: the exact planner is held to 200 ms and 8 machines
  // (an operator's request; the loop's heartbeats wait at most that), the local search
  // takes milliseconds. A ReBalancer that plans continuously runs the solver off the
  // loop (docs/decisions.md).
  o.time_limit_us = 200'000;
  o.neighbourhood = 8;
  if (p.contains("budget")) {
    const json& b = p["budget"];
    if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > 10000)
      return field_error("budget", "must be an integer of moves from 1 to 10000");
    o.move_budget = b.get<size_t>();
  }
  json out = rebalance_plan_json(rebalance_snapshot(model_.alloc, model_.sched, *id,
                                                    model_.broker.entitlements().spec(*id).dc),
                                 o, planner == "exact");
  out["entitlement"] = p["name"];
  return out;
}

Result<json> TendCalls::rebalance_status(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the entitlement's name");
  auto id = model_.broker.entitlements().named(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  if (!rebalancer_)
    return make_error("the ReBalancer is off here ([rebalancer] enabled = false)")
        .with_code(rpc::kUnavailable);
  const EntitlementSpec& e = model_.broker.entitlements().spec(*id);
  return rebalancer_->status({*id, e.name, e.rebalance_paused, e.dc});
}

Result<json> TendCalls::rebalance_pause(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the entitlement's name");
  if (!p.contains("paused") || !p["paused"].is_boolean())
    return field_error("paused", "is required: true to pause, false to resume");
  auto id = model_.broker.entitlements().named(p["name"].get<std::string>());
  if (!id) return field_error("name", "no such entitlement").with_code(rpc::kNotFound);
  TRY(gate_.may_change_jobs(gate_.caller(c), *id));
  const bool paused = p["paused"].get<bool>();
  const bool before = model_.broker.entitlements().set_rebalance_paused(*id, paused);
  if (auto s = fx_.persist({}, {}); !s.ok()) {
    model_.broker.entitlements().set_rebalance_paused(*id, before);  // not durable: not changed
    return std::move(s).error();
  }
  return json{{"entitlement", p["name"]}, {"paused", paused}};
}

void TendCalls::start_autoscaling() {
  AutoscaleRounds::Hooks hooks;
  hooks.scale = [this](const std::string& job, int count) -> Status {
    // Down through the job's TaskController, when it has one: its stops wait for consent.
    TRY_ASSIGN(auto cmds, model_.sched.scale(job, count, now_us(), /*through_controller=*/true));
    // Written, sent, the tick soon, and its controller asked (nothing when it has none).
    return fx_.apply({std::move(cmds), {job}, {}, true, job});
  };
  hooks.decided = [this](const std::string& job, int64_t from, int64_t to,
                         const std::string& reason,
                         const Status& done) { audit_->autoscaler(job, from, to, reason, done); };
  autoscaling_ = std::make_unique<AutoscaleRounds>(
      loop_, model_.sched, *agent_asks_,
      AutoscaleRounds::Options{cfg_.autoscale_interval_us, 5'000'000}, std::move(hooks),
      fx_.notes());
  auto kept = fx_.notes().take_loaded(AutoscaleRounds::kNotePrefix);
  kept.merge(fx_.notes().take_loaded(AutoscaleRounds::kHistoryPrefix));
  autoscaling_->restore(std::move(kept));
  autoscaling_->start();
}

void TendCalls::start_rebalancer() {
  if (!cfg_.rebalancer.enabled) return;
  Rebalancer::Hooks hooks;
  hooks.entitlements = [this] {
    std::vector<Rebalancer::Entitlement> out;
    for (const auto& [id, e] : model_.broker.entitlements())
      if (!model_.sched.handover().fenced(id))
        out.push_back({id, e.name, e.rebalance_paused, e.dc});
    return out;
  };
  hooks.move = [this](const std::string& task, MachineId to, const std::string& reason) -> Status {
    auto t = model_.sched.tasks().find(task);
    if (t == model_.sched.tasks().end()) return field_error("task", "no such task: " + task);
    const std::string job = t->second.job;
    // A spare from the free pool joins the entitlement first (its profile, if another,
    // is applied before the task starts there); given back if the move is refused.
    bool joins = false;
    TRY(join_spare(model_.alloc, model_.sched, task, to, &joins));
    auto cmds = model_.sched.moves().move_task(task, to, reason, now_us());
    if (!cmds.ok()) {
      if (joins) (void)model_.alloc.assign(to, kFreePool);
      return std::move(cmds).error();
    }
    // Written, sent, the tick soon, and its controller asked (nothing when it has none).
    return fx_.apply({std::move(*cmds), {}, {}, true, job});
  };
  hooks.moved = [this](const std::string& ent, const Rebalancer::Event& e) {
    audit_->rebalancer(ent, e.job, e.task, e.from, e.to, e.aim);
  };
  const auto& r = cfg_.rebalancer;
  rebalancer_ = std::make_unique<Rebalancer>(
      loop_, model_.alloc, model_.sched,
      Rebalancer::Options{r.interval_us, r.moves_per_round, r.moves_per_hour, r.move_timeout_us},
      std::move(hooks), &fx_.notes());
  rebalancer_->restore(fx_.notes().take_loaded(Rebalancer::kNotePrefix), now_monotonic_us(),
                       now_realtime_us());
  rebalancer_->start();
}

void TendCalls::register_calls(Calls& calls) {
  calls.add("job.autoscale", kViewerCall, this, &TendCalls::job_autoscale);
  calls.add("job.autoscale.pause", kOperatorCall, this, &TendCalls::job_autoscale_pause);
  calls.add("rebalance.plan", kViewerCall, this, &TendCalls::rebalance_plan);
  calls.add("rebalance.status", kViewerCall, this, &TendCalls::rebalance_status);
  calls.add("rebalance.pause", kOperatorCall, this, &TendCalls::rebalance_pause);
}

}  // namespace weft::cp
