// The control plane's side of service discovery (controlplane/services.h,
// docs/services.md): the endpoints kept in step with the scheduler, pushed to every
// agent that answers DNS, the stops that wait for those agents, and the service.*
// methods.
#include "common/clock.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "controlplane/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {
constexpr size_t kJobsPerSnapshotMessage = 256;  // a message stays far below the line limit
constexpr size_t kMaxServiceWatchers = 1024;
constexpr uint64_t kMaxWatchUs = 60'000'000;
}  // namespace

void Manager::start_services() {
  // Versions keep growing across restarts and failovers (an agent's copy is newer than
  // nothing a restarted control plane says).
  services_.start_at(now_realtime_us());
  // The table is rebuilt from the machines' reports; until every machine had a chance to
  // report (two heartbeat intervals) agents keep the copies they have.
  auto t = loop_->add_timer_in(2 * cfg_.broker.heartbeat_interval_us, [this] {
    services_live_ = true;
    for (const auto& [m, s] : service_sessions_) send_service_snapshot(m, s);
    services_pushed_ = services_.version();
  });
  if (t.ok()) services_live_timer_ = std::move(t).value();
}

void Manager::services_subscribe(MachineId m, rpc::Session* s) {
  if (!s) return;
  services_.subscribe(m);
  service_sessions_[m] = s;
  s->watch_close([this, m, s] {
    auto it = service_sessions_.find(m);
    if (it == service_sessions_.end() || it->second != s) return;  // replaced since
    service_sessions_.erase(it);
    services_.unsubscribe(m);
    release_stops();  // it held nothing back any more
  });
  if (services_live_) send_service_snapshot(m, s);
}

void Manager::send_service_snapshot(MachineId m, rpc::Session* s) {
  auto chunks = services_.snapshot(kJobsPerSnapshotMessage);
  for (size_t i = 0; i < chunks.size(); ++i) {
    bool last = i + 1 == chunks.size();
    s->call("service.update", to_json(chunks[i]), [this, m, last](Result<json> r) {
      if (!last) return;
      on_service_ack(m, r);
    });
  }
}

void Manager::on_service_ack(MachineId m, const Result<json>& r) {
  if (!r.ok() || !r->is_object() || !(*r)["version"].is_number_unsigned()) {
    if (!r.ok() && r.error().code != rpc::kUnavailable)
      log_warn("an agent did not take a service update",
               {{"MACHINE", alloc_.spec(m).name}, {"ERROR", r.error().str()}});
    return;
  }
  services_.ack(m, (*r)["version"].get<uint64_t>());
  release_stops();
}

namespace {
constexpr uint64_t kServicePushUs = 20'000;
}  // namespace

void Manager::recompute_services() {
  auto jobs = sched_.take_service_changes();
  jobs.merge(std::exchange(services_dirty_, {}));
  uint64_t now = now_monotonic_us();
  for (const auto& job : jobs) {
    auto spec = sched_.job(job);
    if (!spec) {
      for (auto& t : services_.erase(job)) services_left_[t] = {services_.version(), 0, now};
      continue;
    }
    const auto& ents = broker_.entitlements();
    auto e = ents.find(spec->entitlement_id);
    Service s = endpoints_of(
        e == ents.end() ? std::string() : e->second.name, sched_.task_refs_of(job),
        [this](MachineId m) { return alloc_.spec(m).name; },
        [this](MachineId m) {
          auto a = addresses_.find(m);
          return a == addresses_.end() ? std::string() : a->second;
        });
    for (auto& t : services_.set(job, s))
      services_left_[t] = {services_.version(), spec->discovery_drain_us, now};
  }
  // What left and was not stopped by the control plane (it ended by itself) is
  // forgotten after a while; a stop of it later needs no withdrawal (it is withdrawn).
  if (services_left_.size() > 1024)
    std::erase_if(services_left_, [&](const auto& e) {
      return now - e.second.at_us > cfg_.discovery_ack_timeout_us + 60'000'000;
    });
  // At the end of this loop iteration, and at most every kServicePushUs however many
  // sends changed endpoints: one update to every agent carries all of them (a push is a
  // message to each agent of the fleet).
  if (services_.version() != services_pushed_ && !push_soon_.active()) {
    auto push = [this] {
      push_soon_.reset();
      last_push_us_ = now_monotonic_us();
      if (services_.version() != services_pushed_) push_services();
    };
    auto d = now >= last_push_us_ + kServicePushUs
                 ? loop_->add_defer(push)
                 : loop_->add_timer_at(last_push_us_ + kServicePushUs, push);
    if (d.ok())
      push_soon_ = std::move(d).value();
    else
      push();
  }
}

std::vector<Command> Manager::refresh_services(const std::vector<Command>& cmds) {
  uint64_t now = now_us();
  // A job's endpoints are worked out again (O(its tasks)) when its stops must wait for
  // their withdrawal, else with the next push: a 1,000-task job starting is not 1,000
  // recomputations of 1,000 endpoints.
  bool stops = false;
  for (const auto& c : cmds) stops |= c.kind == Command::Kind::kStop && cfg_.discovery_withdraw;
  if (stops) {
    recompute_services();
  } else if (!recompute_soon_.active()) {
    auto d = loop_->add_defer([this] {
      recompute_soon_.reset();
      recompute_services();
    });
    if (d.ok())
      recompute_soon_ = std::move(d).value();
    else
      recompute_services();
  }
  std::vector<Command> now_out;
  for (const auto& c : cmds) {
    if (c.kind != Command::Kind::kStop || !cfg_.discovery_withdraw) {
      now_out.push_back(c);
      continue;
    }
    if (auto it = services_left_.find(c.task_id); it != services_left_.end()) {
      // The drain counts from the withdrawal (it may have been worked out a push ago).
      uint64_t since = now_monotonic_us() - it->second.at_us;
      uint64_t drain = it->second.drain_us > since ? it->second.drain_us - since : 0;
      services_.hold_stop(c, it->second.version, now, cfg_.discovery_ack_timeout_us, drain);
      services_left_.erase(it);
      continue;
    }
    if (services_.holds(c.task_id)) continue;  // its stop goes once released
    now_out.push_back(c);
  }
  if (services_.held()) {
    auto r = services_.release(now);
    note_timed_out(r.timed_out);
    now_out.insert(now_out.end(), r.commands.begin(), r.commands.end());
    arm_services_timer();
  }
  return now_out;
}

void Manager::note_timed_out(const std::vector<std::string>& tasks) {
  for (const auto& t : tasks) {
    ++discovery_ack_timeouts_;
    std::string behind;
    for (const auto& [m, s] : service_sessions_)
      if (services_.acked(m) < services_.version()) {
        if (!behind.empty()) behind += ",";
        behind += alloc_.spec(m).name;
        if (behind.size() > 200) break;
      }
    log_warn("a task is stopped before every agent acknowledged its withdrawal",
             {{"TASK", t}, {"BEHIND", behind}});
  }
}

void Manager::push_services() {
  uint64_t now = now_us();
  // Watchers first: they only read.
  std::vector<Watcher> keep;
  for (auto& w : service_watchers_) {
    uint64_t changed = w.job.empty() ? services_.version() : services_.changed_at(w.job);
    if (changed > w.index || now >= w.deadline_us)
      w.reply(service_watch_answer(w.job));
    else
      keep.push_back(std::move(w));
  }
  service_watchers_ = std::move(keep);
  if (!services_live_) return;
  ServiceUpdate u = services_.update_since(services_pushed_);
  services_pushed_ = services_.version();
  std::string msg = to_json(u).dump(-1, ' ', false, json::error_handler_t::replace);  // once
  for (const auto& [machine, s] : service_sessions_) {
    MachineId m = machine;  // (a structured binding cannot be captured before C++20's clang 16)
    s->call_serialized("service.update", msg, [this, m](Result<json> r) { on_service_ack(m, r); });
  }
}

void Manager::release_stops() {
  if (!services_.held()) return;
  auto r = services_.release(now_us());
  note_timed_out(r.timed_out);
  if (!r.commands.empty()) dispatch(r.commands);
  arm_services_timer();
}

void Manager::arm_services_timer() {
  uint64_t at = services_.next_deadline_us();
  if (at == 0) {
    services_timer_ = Source();
    return;
  }
  auto t = loop_->add_timer_at(at, [this] { release_stops(); });
  if (t.ok()) services_timer_ = std::move(t).value();
}

json Manager::service_watch_answer(const std::string& job) const {
  json out{{"index", services_.version()}};
  if (!job.empty()) {
    const Service* s = services_.find(job);
    out["job"] = job;
    out["index"] = services_.changed_at(job);
    out["service"] = s ? to_json(*s) : json();
    return out;
  }
  json all = json::object();
  for (const auto& [name, s] : services_.services()) all[name] = to_json(s);
  out["services"] = std::move(all);
  return out;
}

Result<json> Manager::api_service_ls(const json&, const CallContext&) {
  json out = json::array();
  for (const auto& [job, s] : services_.services()) {
    std::set<std::string> ports;
    for (const auto& e : s.endpoints)
      for (const auto& [name, p] : e.ports) ports.insert(name);
    out.push_back({{"job", job},
                   {"entitlement", s.entitlement},
                   {"endpoints", s.endpoints.size()},
                   {"ports", ports},
                   {"index", services_.changed_at(job)},
                   {"dns", job + "." + s.entitlement + ".weft."}});
  }
  json agents = json::array();
  for (const auto& [m, sess] : service_sessions_)
    agents.push_back({{"machine", alloc_.spec(m).name}, {"version", services_.acked(m)}});
  return json{{"services", out},
              {"version", services_.version()},
              {"agents", agents},
              {"stops_waiting", services_.held()}};
}

Result<json> Manager::api_service_show(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("job") || !p["job"].is_string())
    return field_error("job", "the job's name is required");
  std::string job = p["job"].get<std::string>();
  const Service* s = services_.find(job);
  if (!s) {
    if (!sched_.job(job)) return field_error("job", "no such job " + job).with_code(rpc::kNotFound);
    return json{{"job", job}, {"endpoints", json::array()}, {"index", 0}};
  }
  json out = to_json(*s);
  out["job"] = job;
  out["index"] = services_.changed_at(job);
  out["dns"] = job + "." + s->entitlement + ".weft.";
  return out;
}

Result<json> Manager::api_service_watch(const json& p, const CallContext& c) {
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
  uint64_t changed = job.empty() ? services_.version() : services_.changed_at(job);
  // Consul's blocking query: answered at once when there is something newer than
  // `index`, else when there is or `wait_ms` passes.
  if (changed > index || wait_us == 0 || !c.session) return service_watch_answer(job);
  if (service_watchers_.size() >= kMaxServiceWatchers)
    return make_error("too many service watches; try again").with_code(rpc::kUnavailable);
  service_watchers_.push_back(Watcher{c.session->defer_reply(), job, index, now_us() + wait_us});
  if (!watch_timer_armed_) {
    watch_timer_armed_ = true;
    auto t = loop_->add_timer_in(1'000'000, [this] { expire_watchers(); });
    if (t.ok()) watch_timer_ = std::move(t).value();
  }
  return json();
}

void Manager::expire_watchers() {
  watch_timer_armed_ = false;
  uint64_t now = now_us();
  std::vector<Watcher> keep;
  for (auto& w : service_watchers_) {
    if (now >= w.deadline_us)
      w.reply(service_watch_answer(w.job));
    else
      keep.push_back(std::move(w));
  }
  service_watchers_ = std::move(keep);
  if (!service_watchers_.empty()) {
    watch_timer_armed_ = true;
    auto t = loop_->add_timer_in(1'000'000, [this] { expire_watchers(); });
    if (t.ok()) watch_timer_ = std::move(t).value();
  }
}

}  // namespace weft::cp
