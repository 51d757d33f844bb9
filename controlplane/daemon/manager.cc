#include "controlplane/daemon/manager.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <set>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

uint64_t now_us() {
  return now_monotonic_us();  // the scheduler and broker need a steady clock
}

json task_json(const TaskRecord& t, const Allocator& a) {
  json j{{"id", t.id},
         {"job", t.job},
         {"index", t.index},
         {"generation", t.generation},
         {"machine", a.spec(t.machine).name},
         {"state", task_state_name(t.state)},
         {"ready", available(t)},
         {"message", t.message}};
  if (!t.ports.empty()) j["ports"] = t.ports;
  return j;
}

Manager::Manager(CpConfig cfg, std::unique_ptr<EventLoop> loop)
    : cfg_(std::move(cfg)),
      loop_(std::move(loop)),
      replica_(*loop_, ReplicaRole::Hooks{[this] { return restore_state(); },
                                          [this] {
                                            server_.methods().set_override({});
                                            lead();
                                          }}),
      clocks_(*loop_, cfg_.broker.heartbeat_interval_us,
              Clocks::Hooks{[this] { tick(); }, [this](double s) { metrics_.tick(s); },
                            [this] { watch_heartbeats(); }, [this] { maintenance_round(); }}),
      broker_(alloc_, cfg_.broker),
      sched_(alloc_, cfg_.limits),
      sessions_(cfg_.broker.heartbeat_interval_us, cfg_.broker.missed_heartbeats) {
  discovery_ = std::make_unique<Discovery>(
      *loop_,
      Discovery::Options{cfg_.discovery_ack_timeout_us, cfg_.discovery_withdraw,
                         2 * cfg_.broker.heartbeat_interval_us},
      sched_, alloc_, broker_, [this](const std::vector<Command>& cmds) { dispatch(cmds); });
}

Result<std::unique_ptr<Manager>> Manager::create(CpConfig cfg) {
  TRY_ASSIGN(auto loop, EventLoop::create());
  return std::unique_ptr<Manager>(new Manager(std::move(cfg), std::move(loop)));
}

Manager::~Manager() {
  if (group_ && !replica_.stepped_down()) group_->commit();
  server_.close();
}

Status Manager::run() {
  Status s = loop_->run();
  if (replica_.stepped_down()) return make_error("stopped: this control plane no longer leads");
  group_->commit();  // what the last iteration wrote (its replies are not sent: no loop)
  return s;
}

void Manager::use_store(std::unique_ptr<StateStore> store) {
  store_ = std::move(store);
  store_->set_secrets(secrets_);
  GroupCommit::Options opts;
  opts.replicated = replica_.on_etcd();
  opts.max_age_us = kMaxBatchUs;
  opts.retry_us = replica_.on_etcd() ? 200'000 : 1'000'000;
  GroupCommit::Hooks hooks;
  hooks.rewrite = [this] { return persist({}, {}).ok(); };
  hooks.deposed = [this](const std::string& why) { step_down(why); };
  hooks.committed = [this](uint64_t took_us, bool ended_hold) {
    // A commit that held this loop, or that ends a run of refused ones (their replies
    // were held: the machines timed out and called again), was this control plane's
    // stall, not the machines' silence.
    if (ended_hold || took_us > cfg_.broker.heartbeat_interval_us)
      broker_.excuse_silence_until(now_us());
  };
  group_ = std::make_unique<GroupCommit>(*loop_, *store_, server_.gate(), opts, std::move(hooks));
  audit_ = std::make_unique<AuditLog>(*store_, *group_);
}

Status Manager::start() {
  TRY(mkdir_p(cfg_.state_dir, 0750));
  if (!cfg_.secrets_key.empty()) {
    TRY_ASSIGN(secrets_, SecretBox::load(cfg_.secrets_key));
  }
  // The sockets' group's number, looked up now and remembered: grants are checked
  // against it on the loop (common/task_grants.h), where a slow NSS lookup must not run.
  (void)group_number(cfg_.socket_group);
  if (cfg_.store.kind == "etcd") return start_replica();
  TRY_ASSIGN(auto store, StateStore::open(cfg_.state_dir + "/controlplane.db"));
  use_store(std::move(store));
  TRY(restore_state());
  TRY(serve());
  lead();
  return {};
}

Status Manager::start_replica() {
  TRY_ASSIGN(auto store, EtcdStore::open(cfg_.store.etcd));
  replica_.use(store.get());
  use_store(std::move(store));
  LeaderConfig lc;
  lc.etcd = cfg_.store.etcd.etcd;
  lc.key = cfg_.store.etcd.prefix + "leader";
  lc.identity = advertised();
  lc.ttl_s = cfg_.store.lease_ttl_s;
  // Until this replica leads, every call is answered "not the leader" with where the
  // leader is: machines and weftctl go there (docs/replicas.md).
  server_.methods().set_override(
      [this](const json&, const CallContext&) -> Result<json> {
        const std::string& hint = replica_.leader_hint();
        Error e =
            make_error(hint.empty() ? "this control plane is a follower and no leader is known yet"
                                    : "this control plane is a follower; the leader is " + hint)
                .with_code(rpc::kNotLeader);
        e.leader = hint;
        return e;
      },
      "controlplane.status");
  TRY(serve());
  std::string key = lc.key;
  TRY(replica_.start(std::move(lc)));
  log_info("control plane replica up: following until it wins the election",
           {{"ETCD", cfg_.store.etcd.etcd.endpoints.front()},
            {"KEY", key},
            {"ADVERTISE", advertised()}});
  sd_notify(0, "READY=1");
  return {};
}

Status Manager::restore_state() {
  TRY_CTX(store_->restore(alloc_, broker_, sched_, now_us()), "restoring the control plane state");
  if (store_->secrets_stale()) {
    // Rows written before the key, or under a rotated-out key: every job again, sealed
    // with the current key.
    std::set<std::string> all;
    for (const auto& j : sched_.persisted_jobs()) all.insert(j.spec.name);
    log_info("sealing the stored jobs' secrets with the current key",
             {{"JOBS", std::to_string(all.size())}});
    TRY(persist(all, {}));
    group_->commit();
  }
  // The machines were cut off by this restart (or the old leader's end), not by their
  // own failure: they have the failover grace to come back before any is counted dead.
  broker_.begin_failover_grace(now_us());
  TRY_ASSIGN(auto events, store_->maintenance());
  for (const auto& e : events) maintenance_.restore(e);
  sched_.set_ready_check(
      [this](MachineId m) { return broker_.usable(m) && broker_.state_of(m) != "preparing"; });
  sched_.set_entitlement_dc([this](EntitlementId e) {
    auto it = broker_.entitlements().find(e);
    return it == broker_.entitlements().end() ? std::string() : it->second.dc;
  });
  // Moves of entitlements under way (a shard's): fenced again before anything acts.
  TRY_CTX(load_moves(), "reading the region's moves");
  // Drains in progress: tasks of jobs with a TaskController that were waiting for its
  // consent to move are wanted again (that wish is not stored); others moved already.
  std::vector<Command> redrain;
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (broker_.persisted(m).drained) {
      auto c = sched_.machine_drain(m, now_us());
      redrain.insert(redrain.end(), c.begin(), c.end());
    }
  if (!redrain.empty()) {
    TRY(persist({}, {}));
    group_->commit();  // no session yet: the starts are resent when the machines report
  }
  return {};
}

Status Manager::serve() {
  register_methods();
  log_relay_ = std::make_unique<LogRelay>(
      *loop_, LogRelay::Hooks{[this](MachineId m) { return sessions_.agent(m); },
                              [this](MachineId m) { return machine_name(m); }});
  TRY(server_.listen(cfg_));
  register_metrics();
  metrics_.serve(*loop_, cfg_.metrics_listen);
  if (!cfg_.web_listen.empty())
    TRY(server_.serve_web(cfg_.web_listen, cfg_.web_hosts, [this] { return web_page(); }));
  TRY(loop_->exit_on_termination());
  loop_->enable_watchdog();
  return {};
}

void Manager::lead() {
  if (auto s = start_region(); !s.ok()) {
    log_error("the region's machines could not be read: " + s.error().str());
    if (replica_.replicated()) return step_down("the region's machines could not be read");
  }
  start_task_control();
  start_autoscaling();
  start_rebalancer();
  discovery_->start();
  clocks_.start();
  log_info(replica_.replicated() ? "control plane ready: leading" : "control plane ready",
           {{"SOCKET", cfg_.socket},
            {"LISTEN",
             cfg_.listen.empty() ? "-" : cfg_.listen + ":" + std::to_string(server_.tcp_port())},
            {"TLS", server_.tls() ? "mutual" : "off"},
            {"METRICS", metrics_.address()},
            {"MACHINES", std::to_string(alloc_.machine_count())},
            {"TASKS", std::to_string(sched_.tasks().size())}});
  if (!replica_.replicated()) sd_notify(0, "READY=1");
}

Status check_machine_identity(const rpc::Peer& peer, const std::string& machine) {
  if (!peer.tls) return {};
  const auto& id = peer.identity;
  if (id.common_name == machine || std::find(id.dns.begin(), id.dns.end(), machine) != id.dns.end())
    return {};
  log_warn("refusing a machine call for another machine",
           {{"PEER", peer.address}, {"CERTIFICATE", id.subject}, {"MACHINE", machine}});
  return make_error("this session's certificate (" + id.subject + ") does not name machine '" +
                    machine + "'")
      .with_code(rpc::kPermissionDenied);
}

Caller Manager::caller(const CallContext& c) const {
  return identify_caller(c.peer, cfg_.access, server_.socket_gid(), cfg_.socket_group);
}

Status Manager::permit(const Caller& who, int access, const std::string& method) const {
  return permit_call(who, access, method, cfg_.socket_group);
}

Status Manager::may_change_jobs(const Caller& who, EntitlementId e) const {
  auto it = broker_.entitlements().find(e);
  if (it == broker_.entitlements().end()) return {};  // the operation reports it
  if (may_operate(who, it->second.owners)) return {};
  std::string owners;
  for (const auto& o : it->second.owners) owners += (owners.empty() ? "" : ", ") + o;
  return make_error(who.who + " may not change jobs in entitlement '" + it->second.name +
                    "' (owners: " + (owners.empty() ? "none" : owners) + "; and admins)")
      .with_code(rpc::kPermissionDenied);
}

void Manager::audit_controller(const std::string& job, const std::vector<std::string>& acks,
                               const std::vector<Command>& done) {
  auto spec = sched_.job(job);
  std::string controller = "TaskController";
  if (spec && spec->controller)
    controller += spec->controller->address.empty()
                      ? " (a task of job " + spec->controller->job + ", port " +
                            std::to_string(spec->controller->port) + ")"
                      : " at " + spec->controller->address;
  audit_->controller(job, controller, acks, done);
}

Status Manager::persist(const std::set<std::string>& jobs, const std::set<MachineId>& machines) {
  take_events();
  // What changed since the last write: machines that moved between pools, tasks created
  // or changed (kept across a failed write, for the next one). A write costs what
  // changed, not the size of the jobs or of the fleet.
  Written& w = group_->unsaved();
  for (MachineId m : alloc_.take_moved()) w.machines.insert(m);
  for (auto& id : sched_.take_dirty_tasks()) w.tasks.insert(std::move(id));
  w.machines.insert(machines.begin(), machines.end());
  // A job's row (spec, placement) is written when it changed, not when one of its tasks
  // did: a 1,000-task job starting is 1,000 task rows, not 1,000 copies of its placement.
  w.jobs.insert(jobs.begin(), jobs.end());
  w.jobs.merge(sched_.take_changed_jobs());
  w.jobs.merge(alloc_.take_changed_jobs());
  for (uint64_t id : maintenance_.take_dropped()) w.maintenance.insert(id);
  for (auto& e : broker_.take_new_events()) w.events.push_back(std::move(e));
  TRY(group_->open());
  TRY(store_->begin());
  auto fail = [this](Status s) {
    store_->rollback();
    return s;
  };
  for (const auto& [id, e] : broker_.entitlements())
    if (auto s = store_->put_entitlement(id, e); !s.ok()) return fail(s);
  for (MachineId m : w.machines) {
    Broker::Persisted row = broker_.persisted(m);
    row.pinned = alloc_.pinned(m);
    if (auto s = store_->put_machine(m, row, alloc_.entitlement_of(m)); !s.ok()) return fail(s);
  }
  for (const auto& name : w.jobs) {
    auto j = sched_.persisted_job(name);
    auto s = j ? store_->put_job(*j, alloc_.request(name), alloc_.placement(name),
                                 alloc_.dynamic_ports(name))
               : store_->delete_job(name);
    if (!s.ok()) return fail(s);
  }
  for (const auto& id : w.tasks)
    if (auto it = sched_.tasks().find(id); it != sched_.tasks().end())
      if (auto s = store_->put_task(it->second); !s.ok()) return fail(s);
  if (auto s = store_->put_task_seq(sched_.task_seq()); !s.ok()) return fail(s);
  for (uint64_t id : w.maintenance) {
    auto it = maintenance_.events().find(id);
    auto s = it != maintenance_.events().end() ? store_->put_maintenance(it->second)
                                               : store_->delete_maintenance(id);
    if (!s.ok()) return fail(s);
  }
  if (auto s = store_->put_events(w.events); !s.ok()) return fail(s);
  TRY(store_->commit());
  // Machines whose pool changed may have a new desired profile (push_profiles).
  pool_changes_.changed(w.machines.begin(), w.machines.end());
  Written done = std::move(w);
  w = {};
  group_->wrote(done);  // kept until the group commits; committed now if it is old
  return {};
}

void Manager::send(const std::vector<Command>& cmds) {
  dispatch(discovery_->refresh(cmds));
}

void Manager::dispatch(const std::vector<Command>& cmds) {
  for (const auto& c : cmds) {
    rpc::Session* session = sessions_.agent(c.machine);
    if (!session) continue;  // offline: reconciled when it reports again
    std::string task = c.task_id;
    // A region's shard names itself and the machine's epoch: a command that arrives
    // after the machine left is refused there (agent/cp_session.h HolderFence).
    json holder =
        region_.lending ? region_.lending->holder_of(alloc_.spec(c.machine).name) : json();
    auto fenced = [&holder](json params) {
      if (!holder.is_null() && params.is_object()) {
        params["holder"] = holder["shard"];
        params["epoch"] = holder["epoch"];
      }
      return params;
    };
    if (c.kind == Command::Kind::kStart) {
      // The job's body serialised once, this task's keys spliced in (no JSON built here).
      std::string extra;
      if (!holder.is_null())
        extra = ",\"holder\":" + holder["shard"].dump() + ",\"epoch\":" + holder["epoch"].dump();
      session->call_serialized("task.run", c.run_text(extra), [this, task](Result<json> r) {
        if (r.ok()) return;
        const Error& e = r.error();
        // The session went away or timed out: the start is resent when the machine
        // reports again. A duplicate name: that task runs already (a resend).
        if (e.code == rpc::kUnavailable || e.code == rpc::kTimeout || e.code == rpc::kConflict)
          return;
        log_warn("the machine refused to start a task", {{"TASK", task}, {"ERROR", e.str()}});
        start_refused(task, e, e.code == rpc::kInvalidParams);
      });
    } else if (c.kind == Command::Kind::kPrefetch) {
      MachineId m = c.machine;
      uint64_t generation = c.spec.value("generation", uint64_t{0});
      json params = fenced(c.spec.value("fetch", json::object()));
      params["wait"] = true;
      session->call("image.pull", params, [this, task, m, generation](Result<json> r) {
        if (!r.ok())
          log_warn("a machine could not prefetch an image",
                   {{"JOB", task}, {"ERROR", r.error().str()}});
        prefetched(task, generation, m);
      });
    } else {
      json stop{{"id", task}};
      // A guest taken back stops within its job's notice (its SIGKILL then).
      if (c.spec.is_object() && c.spec.contains("grace")) stop["grace"] = c.spec["grace"];
      session->call("task.stop", fenced(std::move(stop)), [task](Result<json> r) {
        if (!r.ok())
          log_debug("task.stop failed on the machine",
                    {{"TASK", task}, {"ERROR", r.error().str()}});
      });
    }
  }
  push_profiles();
}

void Manager::prefetched(const std::string& job, uint64_t generation, MachineId m) {
  auto cmds = sched_.prefetched(job, generation, m, now_us());
  if (cmds.empty()) return;
  std::set<MachineId> machines;
  for (const auto& c : cmds) machines.insert(c.machine);
  if (auto s = persist({job}, machines); !s.ok()) {
    log_error("cannot write state: " + s.error().str());
    return;
  }
  send(cmds);
}

void Manager::start_refused(const std::string& task, const Error& e, bool bad_spec) {
  // The agent's words, with the field it named: what job.show and weftctl print.
  std::string message = e.field.empty() ? e.message : e.field + ": " + e.message;
  auto cmds = sched_.start_refused(task, message, bad_spec, now_us());
  auto changed = sched_.take_reported_changes();
  if (changed.empty()) return;  // not awaited any more
  std::set<MachineId> machines;
  for (const auto& c : cmds) machines.insert(c.machine);
  if (auto s = persist({}, machines); !s.ok()) log_error("cannot write state: " + s.error().str());
  send(cmds);
}

void Manager::take_events() {
  const uint64_t at = now_realtime_us();
  for (auto& e : sched_.take_events()) {
    std::string machine = e.task.empty() ? std::string() : machine_name(e.machine);  // a job's own
    job_events_.record(e.job, JobEvents::Event{0, at, std::move(e.task), std::move(machine),
                                               std::move(e.what), std::move(e.detail)});
  }
  // Gone jobs' events stay (an operator asks what happened to a job that stopped) until
  // there are many more of them than live jobs.
  if (job_events_.jobs() > 2 * sched_.job_count() + 1000)
    job_events_.keep_only([this](const std::string& job) { return sched_.job(job).has_value(); });
}

void Manager::tick() {
  uint64_t now = now_us();
  take_events();
  if (region_.lending) region_.lending->round(now);
  if (region_.services) region_.services->round();
  std::vector<Command> cmds;
  std::set<MachineId> touched;
  for (MachineId m : check_machines(now)) failures_.went_down(m);
  for (MachineId m : broker_.take_failed()) failures_.went_down(m);
  failures_.count_waiting();
  for (MachineId m : broker_.take_ready(pool_changes_.take_ready())) {
    failures_.back(m);
    auto c = sched_.machine_ready(m, now);
    cmds.insert(cmds.end(), c.begin(), c.end());
  }
  // Machines that did not prepare in time: marked, what waited on them placed elsewhere,
  // and they go back to the free pool once empty.
  for (MachineId m : broker_.take_unprepared(now)) {
    std::string why = prepare_failure(m);
    EntitlementId e = alloc_.entitlement_of(m);
    log_warn("machine did not apply its entitlement's profile in time",
             {{"MACHINE", broker_.persisted(m).info.id}, {"REASON", why}});
    broker_.mark_unprepared(m, why, now);
    auto c = sched_.machine_unprepared(m, why, now);
    cmds.insert(cmds.end(), c.begin(), c.end());
    touched.insert(m);
    (void)alloc_.shrink(e);
  }
  replace_down_machines(now, &cmds, &touched);
  advance_profile_rolls();
  auto c = sched_.tick(now);
  cmds.insert(cmds.end(), c.begin(), c.end());
  auto runs = periodic_.tick(sched_, static_cast<int64_t>(now_realtime_us() / 1'000'000), now);
  cmds.insert(cmds.end(), runs.begin(), runs.end());
  auto pruned = sched_.prune(now, cfg_.ended_task_retention_us, kPruneBudget);
  if (!pruned.empty()) {
    Status deleted = group_->open();
    if (deleted.ok()) deleted = store_->delete_tasks(pruned);
    if (!deleted.ok()) log_error("cannot forget ended tasks: " + deleted.error().str());
  }
  // The jobs of the commands and of the changed tasks are written with them (persist).
  if (auto s = persist({}, touched); !s.ok()) log_error("cannot write state: " + s.error().str());
  send(cmds);
}

std::string Manager::prepare_failure(MachineId m) const {
  std::string want = broker_.desired_profile(m);
  std::string why = "host profile '" + want + "' not applied within " +
                    std::to_string(cfg_.broker.prepare_timeout_us / 1'000'000) + " s";
  auto offered = reports_.profiles_offered.find(m);
  auto state = reports_.profile_state.find(m);
  if (!sessions_.sidekick(m)) return why + ": no weft-sidekick session from this machine";
  if (offered != reports_.profiles_offered.end() && !offered->second.count(want))
    return why + ": its weft-sidekick has no profile '" + want + "'";
  if (state != reports_.profile_state.end() && state->second.is_string() &&
      !state->second.get<std::string>().empty())
    return why + ": its weft-sidekick says: " + state->second.get<std::string>().substr(0, 300);
  return why;
}

std::vector<MachineId> Manager::check_machines(uint64_t now) {
  // While etcd refuses the groups, every reply waits: the machines cannot be heard out.
  // So too while it is slow to take one (it died, say, and the commit has not failed
  // yet): each daemon's report waits for its answer and the daemon sends nothing else,
  // so that silence is no sign of a dead machine (a leader dying with etcd once declared
  // machines dead this way, and its successor started their tasks a second time).
  uint64_t waiting = group_->waiting_since_us();
  if (group_->held() ||
      (waiting != 0 && now > waiting && now - waiting > cfg_.broker.heartbeat_interval_us))
    broker_.excuse_silence_until(now);
  if (auto held = clocks_.held_up(now)) {
    broker_.excuse_silence_until(now);
    log_warn("this control plane was held up; the machines' silence meanwhile is not counted",
             {{"HELD_MS", std::to_string(*held / 1000)}});
  }
  return broker_.check(now);
}

void Manager::watch_heartbeats() {
  // Cheap: the broker looks only at the heartbeats that have expired (Broker::check).
  auto dead = check_machines(now_us());
  if (!dead.empty()) {
    for (MachineId m : dead) failures_.went_down(m);
    kick();
  }
}

void Manager::register_metrics() {
  metrics_.add([this](metrics::Writer& w) {
    w.family("weft_cp_sessions", "gauge", "Sessions open (machines' daemons and operators).");
    w.sample("weft_cp_sessions", static_cast<double>(server_.session_count()));
    w.family("weft_cp_machine_sessions", "gauge", "Machines with a session, by daemon.");
    w.sample("weft_cp_machine_sessions", static_cast<double>(sessions_.agents()),
             {{"daemon", "agent"}});
    w.sample("weft_cp_machine_sessions", static_cast<double>(sessions_.sidekicks()),
             {{"daemon", "sidekick"}});
    metrics_.write_requests(w);
    w.family("weft_cp_commit_seconds", "histogram", "Group commits of the state store.");
    group_->seconds().write(w, "weft_cp_commit_seconds");
    metrics_.write_ticks(w);
    w.family("weft_cp_tasks", "gauge", "Tasks the scheduler knows, by state.");
    for (TaskState s : kAllTaskStates)
      if (size_t n = sched_.count_in(s); n > 0)
        w.sample("weft_cp_tasks", static_cast<double>(n), {{"state", task_state_name(s)}});
    std::map<std::string, size_t> machines;
    for (MachineId m = 0; m < alloc_.machine_count(); ++m)
      if (!broker_.removed(m)) ++machines[broker_.state_of(m)];
    w.family("weft_cp_machines", "gauge", "Machines, by state.");
    for (const auto& [state, n] : machines)
      w.sample("weft_cp_machines", static_cast<double>(n), {{"state", state}});
    w.family("weft_cp_jobs", "gauge", "Jobs.");
    w.sample("weft_cp_jobs", static_cast<double>(sched_.job_count()));
    discovery_->write_metrics(w);
    w.family("weft_cp_replacements_waiting", "gauge",
             "Machines down whose tasks wait for the failure budget, and tasks waiting for "
             "the per-task budget.");
    w.sample("weft_cp_replacements_waiting", static_cast<double>(failures_.waiting()),
             {{"kind", "machines"}});
    w.sample("weft_cp_replacements_waiting", static_cast<double>(sched_.waiting_for_budget()),
             {{"kind", "tasks"}});
    w.family("weft_cp_circuit_breaker_open", "gauge",
             "1 while too much of the fleet is down to replace anything (failure_breaker).");
    w.sample("weft_cp_circuit_breaker_open", failures_.breaker_open() ? 1 : 0);
  });
}

void Manager::replace_down_machines(uint64_t now, std::vector<Command>* cmds,
                                    std::set<MachineId>* touched) {
  size_t fleet = alloc_.machine_count();
  auto step = failures_.step(
      now, fleet,
      [this](MachineId m) {
        std::string state = broker_.state_of(m);
        return state == "dead" || state == "failed";
      },
      [this](MachineId m) { return alloc_.spec(m).domain; });
  if (step.breaker_opened)
    log_error("circuit breaker open: machines down, their tasks are not replaced",
              {{"DOWN", std::to_string(failures_.down())},
               {"MACHINES", std::to_string(fleet)},
               {"WAITING", std::to_string(failures_.waiting())},
               {"BREAKER", std::to_string(cfg_.failure_breaker)}});
  if (step.breaker_closed)
    log_warn("circuit breaker closed: replacing the tasks of machines that went down",
             {{"DOWN", std::to_string(failures_.down())}, {"MACHINES", std::to_string(fleet)}});
  for (MachineId m : step.replace) {
    auto c = sched_.machine_down(m, now, true);
    cmds->insert(cmds->end(), c.begin(), c.end());
    touched->insert(m);
  }
}

Result<JobSpec> Manager::job_from_params(const json& p) const {
  TRY_ASSIGN(weft::JobSpec base, weft::parse_job_spec(p));  // the one job validator
  auto id = broker_.entitlement(base.entitlement);
  if (!id)
    return field_error("entitlement", "no entitlement named " + base.entitlement)
        .with_code(rpc::kNotFound);
  // A job's task gets a network of its own unless it asks for another (the host's is a
  // grant): written into the spec, so the job keeps what it was created with. A job
  // stored before this default keeps the host's network until its next update.
  if (!base.task.is_object()) base.task = json::object();
  json& ns = base.task["namespaces"];
  if (ns.is_null()) ns = json::object();
  if (ns.is_object() && !ns.contains("network")) ns["network"] = "own";
  // What its tasks ask of the host, against what the entitlement grants (an admin's).
  const TaskGrants& grants = broker_.entitlement_spec(*id).grants;
  TRY(check_port_grants(base.ports, grants, base.entitlement, "ports."));
  TRY_ASSIGN(TaskSpec task, parse_task_spec(task_run_params(base, base.name + ".0.0")));
  TRY(check_task_grants(task, grants, base.entitlement, cfg_.socket_group));
  // A control plane with TLS speaks to TCP controllers over mutual TLS only, to the name
  // the job gives: without one, any process on the controller's address would decide.
  if (base.controller && cfg_.tls.enabled() && base.controller->identity.empty()) {
    auto ep = rpc::parse_endpoint(base.controller->address);
    if (!base.controller->job.empty() || (ep.ok() && !ep->is_unix))
      return field_error("task_controller.identity",
                         "is required: this control plane speaks to task controllers over "
                         "mutual TLS; give the name the controller's certificate carries");
  }
  // Secrets are kept sealed at rest: without a key there is nowhere to keep one.
  if (std::string where = first_secret(weft::to_json(base)); !secrets_ && !where.empty())
    return field_error(where.substr(where.find('/') + 1),
                       "is a secret, and this control plane has no secrets_key to seal it "
                       "with at rest (docs/security.md; the packages make one at install)");
  JobSpec spec;
  static_cast<weft::JobSpec&>(spec) = std::move(base);
  spec.entitlement_id = *id;
  return spec;
}

json Manager::machine_json(MachineId m) const {
  auto ent = broker_.entitlements().find(alloc_.entitlement_of(m));
  auto p = broker_.persisted(m);
  return {{"machine", p.info.id},
          {"state", broker_.state_of(m)},
          {"entitlement", ent == broker_.entitlements().end() ? "" : ent->second.name},
          {"dc", p.info.dc},
          {"domain", p.info.domain},
          {"type", p.info.type},
          {"cpu_milli", p.info.capacity.cpu_milli},
          {"mem_mb", p.info.capacity.mem_mb},
          {"tasks", alloc_.tasks_on(m)},
          {"drained", p.drained},
          {"profile", p.applied_profile},
          {"desired_profile", broker_.desired_profile(m)},
          {"profile_state", MachineReports::get(reports_.profile_state, m)},
          {"problems", MachineReports::get(reports_.problems, m)},
          {"controllers", MachineReports::get(reports_.controllers, m)},
          {"connected", sessions_.agent(m) != nullptr},
          {"sidekick_connected", sessions_.sidekick(m) != nullptr},
          {"unprepared", broker_.unprepared_reason(m)}};
}

Result<MachineId> Manager::machine_of(const json& p, const CallContext&) {
  if (!p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  auto m = broker_.find(p["machine"].get<std::string>());
  if (!m) return field_error("machine", "unknown machine; call machine.register first");
  // Removed (machine rm, or gone to another control plane of the region): listed no
  // more, so not found by an operator's call either (a region's front end looks for the
  // one control plane that has it).
  if (broker_.removed(*m))
    return field_error("machine", "machine " + p["machine"].get<std::string>() +
                                      " was removed (or went to another control plane)")
        .with_code(rpc::kNotFound);
  return *m;
}

Result<MachineId> Manager::own_machine(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  return own_machine(p["machine"].get_ref<const std::string&>(), c);
}

Result<MachineId> Manager::own_machine(const std::string& id, const CallContext& c) {
  if (id.empty()) return field_error("machine", "the machine id is required");
  // The certificate first: a machine certificate learns nothing of other machines, not
  // even whether an id exists.
  TRY(check_machine_identity(c.peer, id));
  auto m = broker_.find(id);
  if (!m) return field_error("machine", "unknown machine; call machine.register first");
  return *m;
}

void Manager::apply_commands(const std::vector<Command>& cmds) {
  if (cmds.empty()) return;
  if (auto s = persist({}, {}); !s.ok()) {
    log_error("cannot write state: " + s.error().str());
    return;  // what changed is written again by the next write; commands are resent
  }
  send(cmds);
}

void Manager::start_task_control() {
  control_ = std::make_unique<ControlRounds>(
      *loop_, sched_, alloc_, maintenance_,
      ControlRounds::Hooks{[this](const TaskControllerSpec& c) { return controller_address(c); },
                           [this](const std::string& job, const std::vector<std::string>& acks,
                                  std::vector<Command> cmds) {
                             audit_controller(job, acks, cmds);
                             apply_commands(cmds);
                           },
                           [this](std::vector<Command> cmds) { apply_commands(cmds); }});
  std::shared_ptr<tls::Context> ctx;
  if (cfg_.tls.enabled()) {
    // The control plane's own certificate, as a client: controllers verify it.
    auto c = tls::Context::create(cfg_.tls, tls::Role::kClient);
    if (!c.ok())
      log_error("no TLS for task controllers: TCP controllers are not spoken to",
                {{"ERROR", c.error().str()}});
    else
      ctx = std::move(c).value();
  }
  control_->start(cfg_.tls.enabled(), std::move(ctx));
}

void Manager::start_autoscaling() {
  agent_asks_ =
      std::make_unique<AgentAsks>(*loop_, [this](MachineId m) { return sessions_.agent(m); });
  exec_relay_ = std::make_unique<ExecRelay>("the machine's agent");
  usage_glance_ = std::make_unique<UsageGlance>(*agent_asks_, alloc_, sched_);
  AutoscaleRounds::Hooks hooks;
  hooks.scale = [this](const std::string& job, int count) -> Status {
    // Down through the job's TaskController, when it has one: its stops wait for consent.
    TRY_ASSIGN(auto cmds, sched_.scale(job, count, now_us(), /*through_controller=*/true));
    TRY(persist({job}, {}));
    send(cmds);
    kick();
    if (control_) control_->ask(job);  // (nothing when it has no controller)
    return {};
  };
  hooks.decided = [this](const std::string& job, int64_t from, int64_t to,
                         const std::string& reason,
                         const Status& done) { audit_->autoscaler(job, from, to, reason, done); };
  autoscaling_ = std::make_unique<AutoscaleRounds>(
      *loop_, sched_, *agent_asks_, AutoscaleRounds::Options{cfg_.autoscale_interval_us, 5'000'000},
      std::move(hooks));
  autoscaling_->start();
}

void Manager::start_rebalancer() {
  if (!cfg_.rebalancer.enabled) return;
  Rebalancer::Hooks hooks;
  hooks.entitlements = [this] {
    std::vector<Rebalancer::Entitlement> out;
    for (const auto& [id, e] : broker_.entitlements())
      if (!sched_.fenced(id)) out.push_back({id, e.name, e.rebalance_paused, e.dc});
    return out;
  };
  hooks.move = [this](const std::string& task, MachineId to, const std::string& reason) -> Status {
    auto t = sched_.tasks().find(task);
    if (t == sched_.tasks().end()) return field_error("task", "no such task: " + task);
    const std::string job = t->second.job;
    // A spare from the free pool joins the entitlement first (its profile, if another,
    // is applied before the task starts there); given back if the move is refused.
    bool joins = false;
    TRY(join_spare(alloc_, sched_, task, to, &joins));
    auto cmds = sched_.move_task(task, to, reason, now_us());
    if (!cmds.ok()) {
      if (joins) (void)alloc_.assign(to, kFreePool);
      return std::move(cmds).error();
    }
    TRY(persist({}, {}));
    send(*cmds);
    kick();
    if (control_) control_->ask(job);  // (nothing when it has no controller)
    return {};
  };
  hooks.moved = [this](const std::string& ent, const Rebalancer::Event& e) {
    audit_->rebalancer(ent, e.job, e.task, e.from, e.to, e.aim);
  };
  const auto& r = cfg_.rebalancer;
  rebalancer_ = std::make_unique<Rebalancer>(
      *loop_, alloc_, sched_,
      Rebalancer::Options{r.interval_us, r.moves_per_round, r.moves_per_hour, r.move_timeout_us},
      std::move(hooks));
  rebalancer_->start();
}

std::string Manager::controller_address(const TaskControllerSpec& c) const {
  for (const auto& t : sched_.tasks_of(c.job)) {
    if (!available(t)) continue;
    rpc::Session* s = sessions_.agent(t.machine);
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
