#include "controlplane/discovery/discovery.h"

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc/protocol.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {
constexpr size_t kJobsPerSnapshotMessage = 256;  // a message stays far below the line limit
// The scheduler's clock (now_us in manager.cc): the held stops' deadlines.
uint64_t sched_now_us() {
  return now_monotonic_us();
}
}  // namespace

Discovery::Discovery(EventLoop& loop, Options opts, Scheduler& sched, const Allocator& alloc,
                     const Broker& broker, Dispatch dispatch)
    : loop_(loop),
      opts_(opts),
      sched_(sched),
      alloc_(alloc),
      broker_(broker),
      dispatch_(std::move(dispatch)) {}

void Discovery::set_address(MachineId m, const std::string& address) {
  auto& a = addresses_[m];
  if (a == address) return;
  a = address;
  for (const auto& t : sched_.tasks().on(m)) dirty_.insert(t.job);
}

void Discovery::write_metrics(metrics::Writer& w) const {
  w.family("weft_cp_discovery_version", "gauge",
           "The service discovery table's version (docs/services.md).");
  w.sample("weft_cp_discovery_version", static_cast<double>(table_.version()));
  w.family("weft_cp_discovery_agents_behind", "gauge",
           "Agents answering DNS that have not acknowledged the latest version.");
  w.sample("weft_cp_discovery_agents_behind", static_cast<double>(behind()));
  w.family("weft_cp_discovery_interests", "gauge",
           "Jobs the agents asked to be told of (agents subscribed to every job not counted).");
  size_t interests = 0;
  for (const auto& [m, sess] : sessions_) interests += table_.interests(m);
  w.sample("weft_cp_discovery_interests", static_cast<double>(interests));
  w.family("weft_cp_discovery_stops_waiting", "gauge",
           "Stops held until every agent has the task withdrawn (and the drain).");
  w.sample("weft_cp_discovery_stops_waiting", static_cast<double>(table_.held()));
  w.family("weft_cp_discovery_ack_timeouts_total", "counter",
           "Stops sent after discovery_ack_timeout without every agent's acknowledgement.");
  w.sample("weft_cp_discovery_ack_timeouts_total", static_cast<double>(ack_timeouts_));
}

void Discovery::start() {
  // Versions keep growing across restarts and failovers (an agent's copy is newer than
  // nothing a restarted control plane says).
  table_.start_at(now_realtime_us());
  // The table is rebuilt from the machines' reports; until every machine had a chance to
  // report (two heartbeat intervals) agents keep the copies they have.
  auto t = loop_.add_timer_in(opts_.live_after_us, [this] {
    live_ = true;
    for (const auto& [m, s] : sessions_) send_snapshot(m, s);
    pushed_ = table_.version();
  });
  if (t.ok()) live_timer_ = std::move(t).value();
}

size_t Discovery::behind() const {
  size_t n = 0;
  for (const auto& [m, sess] : sessions_) n += table_.acked(m) < table_.sent_to(m);
  return n;
}

void Discovery::subscribe(MachineId m, rpc::Session* s, bool everything,
                          const std::vector<std::string>& jobs) {
  if (!s) return;
  table_.subscribe(m, everything);
  for (const auto& job : jobs) (void)table_.interest(m, job);
  sessions_[m] = s;
  s->watch_close([this, m, s] {
    auto it = sessions_.find(m);
    if (it == sessions_.end() || it->second != s) return;  // replaced since
    sessions_.erase(it);
    table_.unsubscribe(m);
    release_stops();  // it held nothing back any more
  });
  if (live_) send_snapshot(m, s);
}

void Discovery::send_snapshot(MachineId m, rpc::Session* s) {
  std::vector<ServiceUpdate> chunks;
  if (table_.everything(m)) {
    chunks = table_.snapshot(kJobsPerSnapshotMessage);
  } else {
    // The jobs it asked for (at most kMaxInterests, well inside one message).
    ServiceUpdate u;
    u.version = table_.version();
    u.reset = true;
    for (const auto& [job, svc] : table_.services())
      if (table_.wants(m, job)) u.services.emplace(job, svc);
    chunks.push_back(std::move(u));
  }
  table_.sent(m, table_.version());
  for (size_t i = 0; i < chunks.size(); ++i) {
    bool last = i + 1 == chunks.size();
    s->call("service.update", to_json(chunks[i]), [this, m, last](Result<json> r) {
      if (!last) return;
      on_ack(m, r);
    });
  }
}

void Discovery::on_ack(MachineId m, const Result<json>& r) {
  if (!r.ok() || !r->is_object() || !(*r)["version"].is_number_unsigned()) {
    if (!r.ok() && r.error().code != rpc::kUnavailable)
      log_warn("an agent did not take a service update",
               {{"MACHINE", name(m)}, {"ERROR", r.error().str()}});
    return;
  }
  table_.ack(m, (*r)["version"].get<uint64_t>());
  release_stops();
}

namespace {
constexpr uint64_t kServicePushUs = 20'000;
constexpr uint64_t kAckedPushUs = 1'000'000;
}  // namespace

void Discovery::recompute() {
  auto jobs = sched_.take_service_changes();
  jobs.merge(std::exchange(dirty_, {}));
  uint64_t now = now_monotonic_us();
  for (const auto& job : jobs) {
    auto spec = sched_.job(job);
    if (!spec) {
      for (auto& t : table_.erase(job)) {
        left_[t] = {job, table_.version(), 0, now};
        withdrawn_ = true;
      }
      continue;
    }
    const auto& ents = broker_.entitlements();
    auto e = ents.find(spec->entitlement_id);
    Service s = endpoints_of(
        e == ents.end() ? std::string() : e->second.name, sched_.tasks().refs_of(job),
        [this](MachineId m) { return name(m); },
        [this](MachineId m) {
          auto a = addresses_.find(m);
          return a == addresses_.end() ? std::string() : a->second;
        });
    for (auto& t : table_.set(job, s)) {
      left_[t] = {job, table_.version(), spec->discovery_drain_us, now};
      withdrawn_ = true;
    }
  }
  // What left and was not stopped by the control plane (it ended by itself) is
  // forgotten after a while; a stop of it later needs no withdrawal (it is withdrawn).
  if (left_.size() > 1024)
    std::erase_if(left_, [&](const auto& e) {
      return now - e.second.at_us > opts_.ack_timeout_us + 60'000'000;
    });
  push_soon(now);
}

void Discovery::push_soon(uint64_t now) {
  // At the end of this loop iteration, and at most every kServicePushUs however many
  // sends changed endpoints: one update to every agent carries all of them (a push is a
  // message to each agent of the fleet).
  if (table_.version() != pushed_ && !push_soon_.active()) {
    auto go = [this] {
      push_soon_.reset();
      last_push_us_ = now_monotonic_us();
      if (table_.version() != pushed_) push();
    };
    auto d = now >= last_push_us_ + kServicePushUs
                 ? loop_.add_defer(go)
                 : loop_.add_timer_at(last_push_us_ + kServicePushUs, go);
    if (d.ok())
      push_soon_ = std::move(d).value();
    else
      go();
  }
}

std::map<std::string, Service> Discovery::local() const {
  std::map<std::string, Service> out;
  for (const auto& [job, s] : table_.services())
    if (!foreign_.count(job)) out.emplace(job, s);
  return out;
}

void Discovery::set_foreign(std::map<std::string, Service> others) {
  for (auto it = foreign_.begin(); it != foreign_.end();) {
    if (others.count(*it) || sched_.job(*it)) {
      ++it;
      continue;
    }
    table_.erase(*it);
    it = foreign_.erase(it);
  }
  for (auto& [job, s] : others) {
    if (sched_.job(job)) continue;  // a name of our own wins (region names are unique)
    const Service* now = table_.find(job);
    if (!now || !(*now == s)) table_.set(job, std::move(s));
    foreign_.insert(job);
  }
  if (table_.version() != pushed_) push_soon(now_monotonic_us());
}

std::vector<Command> Discovery::refresh(const std::vector<Command>& cmds) {
  uint64_t now = sched_now_us();
  // A job's endpoints are worked out again (O(its tasks)) when its stops must wait for
  // their withdrawal, else with the next push: a 1,000-task job starting is not 1,000
  // recomputations of 1,000 endpoints.
  bool stops = false;
  for (const auto& c : cmds) stops |= c.kind == Command::Kind::kStop && opts_.withdraw;
  if (stops) {
    recompute();
  } else {
    loop_.defer_once(recompute_soon_, [this] { recompute(); });
  }
  std::vector<Command> now_out;
  for (const auto& c : cmds) {
    if (c.kind != Command::Kind::kStop || !opts_.withdraw) {
      now_out.push_back(c);
      continue;
    }
    if (auto it = left_.find(c.task_id); it != left_.end()) {
      // The drain counts from the withdrawal (it may have been worked out a push ago).
      uint64_t since = now_monotonic_us() - it->second.at_us;
      uint64_t drain = it->second.drain_us > since ? it->second.drain_us - since : 0;
      table_.hold_stop(c, it->second.job, it->second.version, now, opts_.ack_timeout_us, drain);
      left_.erase(it);
      continue;
    }
    if (table_.holds(c.task_id)) continue;  // its stop goes once released
    now_out.push_back(c);
  }
  if (table_.held()) {
    auto r = table_.release(now);
    note_timed_out(r.timed_out);
    now_out.insert(now_out.end(), r.commands.begin(), r.commands.end());
    arm_timer();
  }
  return now_out;
}

void Discovery::note_timed_out(const std::vector<std::string>& tasks) {
  for (const auto& t : tasks) {
    ++ack_timeouts_;
    std::string behind;
    for (const auto& [m, s] : sessions_)
      if (table_.acked(m) < table_.sent_to(m)) {
        if (!behind.empty()) behind += ",";
        behind += name(m);
        if (behind.size() > 200) break;
      }
    log_warn("a task is stopped before every agent acknowledged its withdrawal",
             {{"TASK", t}, {"BEHIND", behind}});
  }
}

void Discovery::push() {
  uint64_t now = sched_now_us();
  watches_.table_changed();  // first: they only read
  if (!live_) return;
  ServiceUpdate u = table_.update_since(pushed_);
  pushed_ = table_.version();
  // Acknowledged when a stop may wait on it (it withdraws an endpoint, or stops are
  // held), and at least every kAckedPushUs; else a notification: a fleet's answers to
  // every push of new endpoints (one per agent, 50 pushes a second while jobs start)
  // cost the control plane as much as the pushes. The next acknowledged push (or the
  // sync below) brings every agent's acknowledged version up to date.
  bool acked = withdrawn_ || table_.held() > 0 || now - last_acked_push_us_ >= kAckedPushUs;
  if (acked) {
    withdrawn_ = false;
    last_acked_push_us_ = now;
  } else {
    arm_sync(now);
  }
  auto send = [&](MachineId m, rpc::Session* s, const std::string& msg) {
    table_.sent(m, u.version);
    if (acked)
      s->call_serialized("service.update", msg, [this, m](Result<json> r) { on_ack(m, r); });
    else
      s->notify_serialized("service.update", msg);
  };
  // Agents subscribed to every job: the whole update, serialised once.
  std::string whole;
  for (const auto& [machine, s] : sessions_) {
    if (!table_.everything(machine)) continue;
    if (whole.empty()) whole = to_json(u).dump(-1, ' ', false, json::error_handler_t::replace);
    send(machine, s, whole);
  }
  // Agents that asked for jobs: those of theirs that changed, nothing when none did (they
  // hold no stop of the others back). Agents asking for the same jobs share one
  // serialisation.
  auto wanted = table_.wanted(u);
  std::map<std::vector<std::string>, std::string> texts;
  for (const auto& [machine, jobs] : wanted) {
    auto sess = sessions_.find(machine);
    if (sess == sessions_.end() || table_.everything(machine)) continue;
    auto text = texts.find(jobs);
    if (text == texts.end()) {
      ServiceUpdate part;
      part.version = u.version;
      for (const auto& job : jobs) part.services.emplace(job, u.services.at(job));
      text = texts.emplace(jobs, to_json(part).dump(-1, ' ', false, json::error_handler_t::replace))
                 .first;
    }
    send(machine, sess->second, text->second);
  }
  // A reset (an update further behind than the removals kept) goes to every agent.
  if (u.reset)
    for (const auto& [machine, s] : sessions_)
      if (!table_.everything(machine) && !wanted.count(machine))
        send(machine, s,
             to_json(table_.part_for(machine, u))
                 .dump(-1, ' ', false, json::error_handler_t::replace));
}

Result<json> Discovery::interest(MachineId m, const rpc::Session* s, const json& p) {
  auto sess = sessions_.find(m);
  if (sess == sessions_.end() || sess->second != s)
    return make_error("this session does not serve discovery: register with serves_discovery")
        .with_code(rpc::kInvalidParams);
  if (!p.is_object()) return field_error("params", "must be an object");
  // `jobs`: what it answers for from now on; `forget` (optional): what it no longer does.
  for (const char* field : {"jobs", "forget"}) {
    if (!p.contains(field) && std::string_view(field) == "forget") continue;
    if (!p.contains(field) || !p[field].is_array() || p[field].size() > ServiceTable::kMaxInterests)
      return field_error(field, "must be a list of at most " +
                                    std::to_string(ServiceTable::kMaxInterests) + " job names");
    for (const auto& j : p[field])
      if (!j.is_string() || !valid_job_name(j.get_ref<const std::string&>()))
        return field_error(
            field,
            "names no job: " + (j.is_string() ? j.get<std::string>().substr(0, 64) : j.dump()));
  }
  // Forgotten first: an agent at its bound forgets one job to ask for another.
  bool forgot = false;
  if (p.contains("forget"))
    for (const auto& j : p["forget"]) forgot |= table_.forget(m, j.get_ref<const std::string&>());
  if (forgot) release_stops();  // a stop may have waited for this agent only
  ServiceUpdate u;
  u.version = table_.version();
  size_t full = 0;
  for (const auto& j : p["jobs"]) {
    const std::string& job = j.get_ref<const std::string&>();
    if (table_.interest(m, job) == ServiceTable::Interest::kFull) ++full;
    // Its endpoints now, whatever the name's case (DNS names are case-insensitive).
    // While the table is still being rebuilt from the machines' reports after a start,
    // that may be part of them: better than nothing for a job the agent did not hold
    // (one it held it does not ask for again), and the snapshot brings the whole once
    // the table is live.
    for (const auto& name : table_.any_case(job)) u.services.emplace(name, *table_.find(name));
  }
  // What it was sent: these jobs as they are now, and the others as pushed. The next
  // acknowledged update (a push of its jobs, or the sync) says when it holds them, so a
  // stop held for a job it asked for late waits for that, not for the timeout.
  table_.sent(m, pushed_);
  arm_sync(now_monotonic_us());
  if (full)
    log_warn("an agent asked for more jobs than it may answer for",
             {{"MACHINE", name(m)}, {"REFUSED", std::to_string(full)}});
  json out = to_json(u);
  out["refused"] = full;
  return out;
}

void Discovery::arm_sync(uint64_t now) {
  if (sync_.active()) return;
  auto t = loop_.add_timer_at(std::max(now, last_acked_push_us_ + kAckedPushUs), [this] {
    sync_.reset();
    if (!live_) return;
    // An answered push went out since the timer was set: the sync is due an interval
    // after it (returning here without a timer left a later unanswered push
    // unacknowledged for as long as nothing changed).
    uint64_t at = now_monotonic_us();
    if (at - last_acked_push_us_ < kAckedPushUs) {
      arm_sync(at);
      return;
    }
    // Nothing pushed with an answer since: the agents behind are asked for their version
    // with an update that changes nothing (the version they hold, no job).
    last_acked_push_us_ = at;
    ServiceUpdate u;
    u.version = pushed_;
    std::string msg = to_json(u).dump();
    for (const auto& [machine, s] : sessions_) {
      MachineId m = machine;
      if (table_.acked(m) < table_.sent_to(m))
        s->call_serialized("service.update", msg, [this, m](Result<json> r) { on_ack(m, r); });
    }
  });
  if (t.ok()) sync_ = std::move(t).value();
}

void Discovery::release_stops() {
  if (!table_.held()) return;
  auto r = table_.release(sched_now_us());
  note_timed_out(r.timed_out);
  if (!r.commands.empty()) dispatch_(r.commands);
  arm_timer();
}

void Discovery::arm_timer() {
  uint64_t at = table_.next_deadline_us();
  if (at == 0) {
    timer_ = Source();
    return;
  }
  auto t = loop_.add_timer_at(at, [this] { release_stops(); });
  if (t.ok()) timer_ = std::move(t).value();
}

Result<json> Discovery::ls(const json& p) const {
  if (!p.is_null() && !p.is_object()) return field_error("params", "must be an object");
  bool local = false;
  if (p.is_object() && p.contains("local")) {
    if (!p["local"].is_boolean()) return field_error("local", "must be true or false");
    local = p["local"].get<bool>();
  }
  json out = json::array();
  for (const auto& [job, s] : table_.services()) {
    if (local && foreign_.count(job)) continue;
    std::set<std::string> ports;
    for (const auto& e : s.endpoints)
      for (const auto& [name, port] : e.ports) ports.insert(name);
    out.push_back({{"job", job},
                   {"entitlement", s.entitlement},
                   {"endpoints", s.endpoints.size()},
                   {"ports", ports},
                   {"index", table_.changed_at(job)},
                   {"dns", job + "." + s.entitlement + ".weft."}});
  }
  json agents = json::array();
  for (const auto& [m, sess] : sessions_) {
    // `behind`: it has not acknowledged all it was sent.
    json a{{"machine", name(m)},
           {"version", table_.acked(m)},
           {"behind", table_.acked(m) < table_.sent_to(m)}};
    if (table_.everything(m))
      a["jobs"] = "all";
    else
      a["jobs"] = table_.interests(m);
    agents.push_back(std::move(a));
  }
  return json{{"services", out},
              {"version", table_.version()},
              {"agents", agents},
              {"stops_waiting", table_.held()}};
}

Result<json> Discovery::show(const json& p) const {
  if (!p.is_object() || !p.contains("job") || !p["job"].is_string())
    return field_error("job", "the job's name is required");
  std::string job = p["job"].get<std::string>();
  const Service* s = table_.find(job);
  if (!s) {
    if (!sched_.job(job)) return field_error("job", "no such job " + job).with_code(rpc::kNotFound);
    return json{{"job", job}, {"endpoints", json::array()}, {"index", 0}};
  }
  json out = to_json(*s);
  out["job"] = job;
  out["index"] = table_.changed_at(job);
  out["dns"] = job + "." + s->entitlement + ".weft.";
  return out;
}

}  // namespace weft::cp
