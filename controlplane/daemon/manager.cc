#include "controlplane/daemon/manager.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <set>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "controlplane/store/etcd_store.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

Manager::Features::Features(const ShardParts& s)
    : machines(s),
      entitlements(s),
      jobs(s),
      tasks(s),
      logs(s),
      maintenance(s),
      discovery(s),
      tend(s),
      usage(s),
      web(s, entitlements),
      status(s),
      region(s, machines, [this] { return tend.wanted(); }) {}

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
                            [this] { watch_heartbeats(); },
                            [this] { features_->maintenance.maintenance_round(); }}),
      broker_(alloc_, cfg_.broker),
      sched_(alloc_, cfg_.limits),
      sessions_(cfg_.broker.heartbeat_interval_us, cfg_.broker.missed_heartbeats),
      rounds_{Notes{},
              ProfileRolls{alloc_, broker_, rounds_.notes},
              Maintenance{},
              JobEvents{},
              PeriodicRuns{},
              FailureBudget{{cfg_.machine_failures_per_min, cfg_.machine_failures_burst,
                             cfg_.failure_breaker}}},
      model_{alloc_, broker_, sched_, sessions_, reports_, pool_changes_},
      gate_(cfg_.access, cfg_.socket_group, server_, broker_),
      fx_(Effects::Parts{model_, rounds_.maintenance, rounds_.job_events, rounds_.notes, clocks_,
                         leading_.discovery, store_, group_, audit_, region_.lending,
                         leading_.control}) {
  // A lost task of an at-most-one job starts elsewhere only after its machine's lease.
  sched_.replacement().set_lease_end([this](MachineId m) { return broker_.lease_end_us(m); });
  leading_.discovery = std::make_unique<Discovery>(
      *loop_,
      Discovery::Options{cfg_.discovery_ack_timeout_us, cfg_.discovery_withdraw,
                         2 * cfg_.broker.heartbeat_interval_us},
      sched_, alloc_, broker_, [this](const std::vector<Command>& cmds) { fx_.dispatch(cmds); });
  features_ = std::make_unique<Features>(ShardParts{cfg_,
                                                    *loop_,
                                                    model_,
                                                    rounds_.maintenance,
                                                    rounds_.profile_rolls,
                                                    rounds_.job_events,
                                                    rounds_.periodic,
                                                    clocks_,
                                                    replica_,
                                                    leading_.discovery,
                                                    store_,
                                                    group_,
                                                    audit_,
                                                    leading_.control,
                                                    leading_.agent_asks,
                                                    leading_.exec_relay,
                                                    leading_.log_relay,
                                                    leading_.usage_glance,
                                                    secrets_,
                                                    region_,
                                                    server_.methods(),
                                                    fx_,
                                                    gate_});
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
  hooks.rewrite = [this] { return fx_.persist({}, {}).ok(); };
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
  lc.identity = advertised(cfg_);
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
            {"ADVERTISE", advertised(cfg_)}});
  sd_notify(0, "READY=1");
  return {};
}

Status Manager::restore_state() {
  TRY_CTX(store_->restore(alloc_, broker_, sched_, now_us()), "restoring the control plane state");
  if (store_->secrets_stale()) {
    // Rows written before the key, or under a rotated-out key: every job again, sealed
    // with the current key.
    std::set<std::string> all;
    for (const auto& j : sched_.handover().persisted_jobs()) all.insert(j.spec.name);
    log_info("sealing the stored jobs' secrets with the current key",
             {{"JOBS", std::to_string(all.size())}});
    TRY(fx_.persist(all, {}));
    group_->commit();
  }
  // The machines were cut off by this restart (or the old leader's end), not by their
  // own failure: they have the failover grace to come back before any is counted dead.
  broker_.begin_failover_grace(now_us());
  TRY_ASSIGN(auto events, store_->maintenance());
  for (const auto& e : events) rounds_.maintenance.restore(e);
  // What the last leader's features kept (store/notes.h): each takes its own.
  TRY_ASSIGN(auto notes, store_->notes());
  rounds_.notes.set_loaded(std::move(notes));
  rounds_.job_events.restore(rounds_.notes.take_loaded(JobEvents::kNotePrefix), rounds_.notes);
  rounds_.profile_rolls.restore(rounds_.notes.take_loaded(ProfileRolls::kNotePrefix));
  sched_.placer().set_ready_check(
      [this](MachineId m) { return broker_.usable(m) && broker_.state_of(m) != "preparing"; });
  sched_.placer().set_entitlement_dc([this](EntitlementId e) {
    auto it = broker_.entitlements().find(e);
    return it == broker_.entitlements().end() ? std::string() : it->second.dc;
  });
  // Moves of entitlements under way (a shard's): fenced again before anything acts.
  TRY_CTX(features_->region.load_moves(), "reading the region's moves");
  // Drains in progress: tasks of jobs with a TaskController that were waiting for its
  // consent to move are wanted again (that wish is not stored); others moved already.
  std::vector<Command> redrain;
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (broker_.persisted(m).drained) {
      auto c = sched_.moves().machine_drain(m, now_us());
      redrain.insert(redrain.end(), c.begin(), c.end());
    }
  if (!redrain.empty()) {
    TRY(fx_.persist({}, {}));
    group_->commit();  // no session yet: the starts are resent when the machines report
  }
  return {};
}

Status Manager::serve() {
  // Each feature adds the calls it answers; the table routes and guards them (calls.h).
  calls_ = std::make_unique<Calls>(
      server_.methods(), Calls::Parts{gate_, metrics_, group_, audit_, replica_.on_etcd(),
                                      [this](const std::string& machine) -> Status {
                                        return region_.lending ? region_.lending->admit(machine)
                                                               : Status{};
                                      }});
  Features& f = *features_;
  for (Feature* each : std::initializer_list<Feature*>{
           &f.machines, &f.entitlements, &f.jobs, &f.tasks, &f.logs, &f.maintenance, &f.discovery,
           &f.tend, &f.usage, &f.web, &f.status, &f.region})
    each->register_calls(*calls_);
  leading_.log_relay = std::make_unique<LogRelay>(
      *loop_, LogRelay::Hooks{[this](MachineId m) { return sessions_.agent(m); },
                              [this](MachineId m) { return fx_.machine_name(m); }});
  TRY(server_.listen(cfg_));
  register_metrics();
  metrics_.serve(*loop_, cfg_.metrics_listen);
  if (!cfg_.web_listen.empty())
    TRY(server_.serve_web(cfg_.web_listen, cfg_.web_hosts,
                          [this] { return features_->web.web_page(); }));
  TRY(loop_->exit_on_termination());
  loop_->enable_watchdog();
  return {};
}

void Manager::lead() {
  if (auto s = features_->region.start_region(); !s.ok()) {
    log_error("the region's machines could not be read: " + s.error().str());
    if (replica_.replicated()) return step_down("the region's machines could not be read");
  }
  start_task_control();
  // What tasks use, asked of the agents (autoscaling's rounds, top, the web view), and
  // the relay of task exec's bytes.
  leading_.agent_asks =
      std::make_unique<AgentAsks>(*loop_, [this](MachineId m) { return sessions_.agent(m); });
  leading_.exec_relay = std::make_unique<ExecRelay>("the machine's agent");
  leading_.usage_glance = std::make_unique<UsageGlance>(*leading_.agent_asks, alloc_, sched_);
  features_->tend.start_autoscaling();
  features_->tend.start_rebalancer();
  leading_.discovery->start();
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

void Manager::tick() {
  uint64_t now = now_us();
  fx_.take_events();
  if (region_.lending) region_.lending->round(now);
  if (region_.services) region_.services->round();
  std::vector<Command> cmds;
  std::set<MachineId> touched;
  for (MachineId m : check_machines(now)) rounds_.failures.went_down(m);
  for (MachineId m : broker_.take_failed()) rounds_.failures.went_down(m);
  rounds_.failures.count_waiting();
  const std::set<MachineId> moved = pool_changes_.take_ready();
  for (MachineId m : broker_.take_ready(&moved)) {
    rounds_.failures.back(m);
    auto c = sched_.placer().machine_ready(m, now);
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
    auto c = sched_.placer().machine_unprepared(m, why, now);
    cmds.insert(cmds.end(), c.begin(), c.end());
    touched.insert(m);
    (void)alloc_.shrink(e);
  }
  replace_down_machines(now, &cmds, &touched);
  features_->entitlements.advance_profile_rolls();
  auto c = sched_.tick(now);
  cmds.insert(cmds.end(), c.begin(), c.end());
  const uint64_t wall_us = now_realtime_us();
  if (int64_t step = rounds_.periodic.observe_clock(sched_, now_monotonic_us(), wall_us))
    log_warn(
        "the wall clock stepped; leases, heartbeats and timeouts count on the monotonic "
        "clock and are not moved",
        {{"STEP_SECONDS", std::to_string(static_cast<double>(step) / 1e6)},
         {"NOW", format_rfc3339(static_cast<int64_t>(wall_us))}});
  auto runs = rounds_.periodic.tick(sched_, static_cast<int64_t>(wall_us / 1'000'000), now);
  cmds.insert(cmds.end(), runs.begin(), runs.end());
  auto pruned = sched_.prune(now, cfg_.ended_task_retention_us, kPruneBudget);
  if (!pruned.empty()) {
    Status deleted = group_->open();
    if (deleted.ok()) deleted = store_->delete_tasks(pruned);
    if (!deleted.ok()) log_error("cannot forget ended tasks: " + deleted.error().str());
  }
  // The jobs' events for the next leader: what this tick's second recorded, one note a
  // job at most (a note every write cost a busy control plane 40% of its job creations).
  fx_.take_events();
  rounds_.job_events.save(rounds_.notes);
  // The jobs of the commands and of the changed tasks are written with them (persist).
  if (auto s = fx_.persist({}, touched); !s.ok())
    log_error("cannot write state: " + s.error().str());
  fx_.send(cmds);
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
  uint64_t now = now_us();
  auto dead = check_machines(now);
  for (MachineId m : dead) rounds_.failures.went_down(m);
  // A lease that ended (at-most-one jobs) is acted on within this quarter interval too.
  if (!dead.empty() ||
      (sched_.replacement().waiting_for_lease() > 0 && sched_.replacement().fenced_due(now)))
    fx_.kick();
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
    w.family("weft_cp_commit_failures_total", "counter",
             "Groups of writes the state store did not take (a full or failing disk, etcd "
             "away); what they covered is kept in memory and written again.");
    w.sample("weft_cp_commit_failures_total", static_cast<double>(group_->failures()));
    w.family("weft_cp_commit_failing", "gauge",
             "1 while the state store refuses writes: operators' changes are refused, "
             "machines are answered from memory.");
    w.sample("weft_cp_commit_failing", group_->failing() ? 1 : 0);
    metrics_.write_ticks(w);
    w.family("weft_cp_tasks", "gauge", "Tasks the scheduler knows, by state.");
    for (TaskState s : kAllTaskStates)
      if (size_t n = sched_.tasks().count_in(s); n > 0)
        w.sample("weft_cp_tasks", static_cast<double>(n), {{"state", task_state_name(s)}});
    std::map<std::string, size_t> machines;
    for (MachineId m = 0; m < alloc_.machine_count(); ++m)
      if (!broker_.removed(m)) ++machines[broker_.state_of(m)];
    w.family("weft_cp_machines", "gauge", "Machines, by state.");
    for (const auto& [state, n] : machines)
      w.sample("weft_cp_machines", static_cast<double>(n), {{"state", state}});
    w.family("weft_cp_jobs", "gauge", "Jobs.");
    w.sample("weft_cp_jobs", static_cast<double>(sched_.job_count()));
    leading_.discovery->write_metrics(w);
    w.family("weft_cp_replacements_waiting", "gauge",
             "Machines down whose tasks wait for the failure budget, tasks waiting for "
             "the per-task budget, and lost tasks of at-most-one jobs waiting for their "
             "machine's lease to end.");
    w.sample("weft_cp_replacements_waiting", static_cast<double>(rounds_.failures.waiting()),
             {{"kind", "machines"}});
    w.sample("weft_cp_replacements_waiting",
             static_cast<double>(sched_.replacement().waiting_for_budget()), {{"kind", "tasks"}});
    w.sample("weft_cp_replacements_waiting",
             static_cast<double>(sched_.replacement().waiting_for_lease()), {{"kind", "lease"}});
    w.family("weft_cp_circuit_breaker_open", "gauge",
             "1 while too much of the fleet is down to replace anything (failure_breaker).");
    w.sample("weft_cp_circuit_breaker_open", rounds_.failures.breaker_open() ? 1 : 0);
  });
}

void Manager::replace_down_machines(uint64_t now, std::vector<Command>* cmds,
                                    std::set<MachineId>* touched) {
  size_t fleet = alloc_.machine_count();
  auto step = rounds_.failures.step(
      now, fleet,
      [this](MachineId m) {
        std::string state = broker_.state_of(m);
        return state == "dead" || state == "failed";
      },
      [this](MachineId m) { return alloc_.spec(m).domain; });
  if (step.breaker_opened)
    log_error("circuit breaker open: machines down, their tasks are not replaced",
              {{"DOWN", std::to_string(rounds_.failures.down())},
               {"MACHINES", std::to_string(fleet)},
               {"WAITING", std::to_string(rounds_.failures.waiting())},
               {"BREAKER", std::to_string(cfg_.failure_breaker)}});
  if (step.breaker_closed)
    log_warn(
        "circuit breaker closed: replacing the tasks of machines that went down",
        {{"DOWN", std::to_string(rounds_.failures.down())}, {"MACHINES", std::to_string(fleet)}});
  for (MachineId m : step.replace) {
    auto c = sched_.replacement().machine_down(m, now, true);
    cmds->insert(cmds->end(), c.begin(), c.end());
    touched->insert(m);
  }
}

void Manager::start_task_control() {
  leading_.control = std::make_unique<ControlRounds>(
      *loop_, sched_, alloc_, rounds_.maintenance,
      ControlRounds::Hooks{
          [this](const TaskControllerSpec& c) { return controller_address(sched_, sessions_, c); },
          [this](const std::string& job, const std::vector<std::string>& acks,
                 std::vector<Command> cmds) {
            fx_.audit_controller(job, acks, cmds);
            fx_.apply_logged(Decision{std::move(cmds)});
          },
          [this](std::vector<Command> cmds) { fx_.apply_logged(Decision{std::move(cmds)}); }});
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
  leading_.control->start(cfg_.tls.enabled(), std::move(ctx));
}

}  // namespace weft::cp
