// The web view's page, from the same state the listings show (web_view.h): served on the
// loopback web_listen and, to viewers over mutual TLS, by web.page (`weftctl web`).
#include "controlplane/web/calls.h"
#include "common/clock.h"
#include "controlplane/web/web_view.h"

namespace weft::cp {

using nlohmann::json;

WebCalls::WebCalls(const ShardParts& s, const EntitlementCalls& entitlements)
    : cfg_(s.cfg),
      model_(s.model),
      job_events_(s.job_events),
      maintenance_(s.maintenance),
      profile_rolls_(s.profile_rolls),
      replica_(s.replica),
      usage_glance_(s.usage_glance),
      entitlements_(entitlements) {}

std::string WebCalls::web_page() const {
  FleetSnapshot s;
  s.now_wall_us = static_cast<int64_t>(now_realtime_us());
  s.leader = advertised(cfg_);
  if (replica_.following())
    return "<!doctype html><html><head><meta charset=\"utf-8\"><title>weft fleet</title></head>"
           "<body><h1>weft fleet</h1><p id=\"follower\">This replica does not lead; the leader "
           "is " +
           html_escape(replica_.leader_hint().empty() ? "being elected" : replica_.leader_hint()) +
           ".</p></body></html>\n";
  for (MachineId m = 0; m < model_.alloc.machine_count(); ++m)
    if (!model_.broker.removed(m))
      s.machines.push_back(
          machine_json(m, model_.alloc, model_.broker, model_.reports, model_.sessions));
  for (const auto& [id, e] : model_.broker.entitlements()) {
    json j{{"name", e.name},
           {"quota", e.quota},
           {"profile", e.profile},
           {"owners", e.owners},
           {"machines", model_.alloc.pool(id).machines}};
    if (profile_rolls_.rolling(id)) j["profile_roll"] = entitlements_.profile_roll_json(id);
    s.entitlements.push_back(std::move(j));
  }
  for (const auto& j : model_.sched.handover().persisted_jobs()) {
    int ready = 0, current = 0;
    for (const TaskRecord* t : model_.sched.tasks().refs_of(j.spec.name)) {
      ready += available(*t);
      current += available(*t) && t->generation == j.generation;
    }
    json row{{"name", j.spec.name},        {"entitlement", j.spec.entitlement},
             {"count", j.spec.count},      {"ready", ready},
             {"current", current},         {"generation", j.generation},
             {"stopping", j.stopping},     {"paused", j.progress.paused},
             {"canary", j.progress.canary}};
    if (j.spec.is_batch()) {
      row["kind"] = j.spec.periodic ? "periodic" : "batch";
      row["completions"] = j.spec.batch.completions;
      row["succeeded"] = j.progress.succeeded;
      row["outcome"] = j.progress.outcome;
      if (j.spec.periodic) row["schedule"] = j.spec.periodic->schedule;
    }
    s.jobs.push_back(std::move(row));
  }
  for (const auto& [id, e] : maintenance_.events())
    if (e.active()) s.maintenance.push_back(to_json(e));
  s.events = job_events_.latest(30);
  if (usage_glance_) s.usage = usage_glance_->glance(now_monotonic_us());
  return render_fleet_html(s);
}

Result<json> WebCalls::web_page(const json&, const rpc::CallContext&) {
  return json{{"html", web_page()}};
}

void WebCalls::register_calls(Calls& calls) {
  calls.add("web.page", kViewerCall, this, &WebCalls::web_page);
}

}  // namespace weft::cp
