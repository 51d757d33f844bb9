#include "controlplane/manager.h"

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
      broker_(alloc_, cfg_.broker),
      sched_(alloc_, cfg_.limits) {
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
  if (group_ && !stepped_down_) group_->commit();
  server_.reset();
}

Status Manager::run() {
  Status s = loop_->run();
  if (stepped_down_) return make_error("stopped: this control plane no longer leads");
  group_->commit();  // what the last iteration wrote (its replies are not sent: no loop)
  return s;
}

void Manager::use_store(std::unique_ptr<StateStore> store) {
  store_ = std::move(store);
  store_->set_secrets(secrets_);
  GroupCommit::Options opts;
  opts.replicated = etcd_ != nullptr;
  opts.max_age_us = kMaxBatchUs;
  opts.retry_us = etcd_ ? 200'000 : 1'000'000;
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
  group_ = std::make_unique<GroupCommit>(*loop_, *store_, *gate_, opts, std::move(hooks));
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
  etcd_ = store.get();
  use_store(std::move(store));
  LeaderConfig lc;
  lc.etcd = cfg_.store.etcd.etcd;
  lc.key = cfg_.store.etcd.prefix + "leader";
  lc.identity = !cfg_.store.advertise.empty() ? cfg_.store.advertise : cfg_.listen;
  lc.ttl_s = cfg_.store.lease_ttl_s;
  // Until this replica leads, every call is answered "not the leader" with where the
  // leader is: machines and weftctl go there (docs/replicas.md).
  methods_.set_override(
      [this](const json&, const CallContext&) -> Result<json> {
        Error e =
            make_error(leader_hint_.empty()
                           ? "this control plane is a follower and no leader is known yet"
                           : "this control plane is a follower; the leader is " + leader_hint_)
                .with_code(rpc::kNotLeader);
        e.leader = leader_hint_;
        return e;
      },
      "controlplane.status");
  TRY(serve());
  TRY_ASSIGN(leadership_, Leadership::start(lc));
  watch_election();
  log_info("control plane replica up: following until it wins the election",
           {{"ETCD", cfg_.store.etcd.etcd.endpoints.front()},
            {"KEY", lc.key},
            {"ADVERTISE", lc.identity}});
  sd_notify(0, "READY=1");
  return {};
}

void Manager::watch_election() {
  auto t = loop_->add_timer_in(50'000, [this] {
    check_leadership();
    if (!stepped_down_) watch_election();
  });
  if (t.ok()) election_timer_ = std::move(t).value();
}

void Manager::check_leadership() {
  if (stepped_down_) return;
  if (leadership_->lost()) return step_down(leadership_->lost_reason());
  if (etcd_->fenced_out()) return step_down("a write was refused: another control plane leads");
  if (leading_) return;
  leader_hint_ = leadership_->leader();
  if (!leadership_->leading()) return;
  // Won: the state is read now, not before (the previous leader wrote until its end).
  etcd_->fence(cfg_.store.etcd.prefix + "leader", leadership_->revision());
  uint64_t t0 = now_us();
  if (auto s = restore_state(); !s.ok())
    return step_down("cannot read the state from etcd: " + s.error().str());
  leading_ = true;
  leader_hint_.clear();
  methods_.set_override({});
  lead();
  log_info("this control plane leads now",
           {{"RESTORE_MS", std::to_string((now_us() - t0) / 1000)}});
}

void Manager::step_down(const std::string& why) {
  stepped_down_ = true;
  // Nothing held is sent (the group was not written): the machines hear it from the
  // next leader. The process ends; systemd starts it again as a follower.
  log_error("this control plane no longer leads; stopping", {{"REASON", why}});
  loop_->exit(3);
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
  weft_gid_ = group_gid(cfg_.socket_group);
  register_methods();
  log_relay_ = std::make_unique<LogRelay>(
      *loop_, LogRelay::Hooks{[this](MachineId m) -> rpc::Session* {
                                auto s = sessions_.find(m);
                                return s == sessions_.end() ? nullptr : s->second;
                              },
                              [this](MachineId m) { return machine_name(m); }});
  server_ = std::make_unique<rpc::Server>(*loop_, &methods_);
  server_->set_output_gate(gate_);
  TRY(server_->listen_unix(cfg_.socket, 0660, weft_gid_));
  if (!cfg_.listen.empty()) {
    if (cfg_.tls.enabled()) {
      if (cfg_.tls_resumption) {
        cfg_.tls.ticket_key_file = cfg_.state_dir + "/tls-ticket.key";
        if (!path_exists(cfg_.tls.ticket_key_file))
          TRY(tls::write_ticket_key(cfg_.tls.ticket_key_file));
      }
      TRY_ASSIGN(tls_, tls::Context::create(cfg_.tls, tls::Role::kServer));
      server_->set_tls(tls_);
    }
    TRY_ASSIGN(auto ep, rpc::parse_endpoint(cfg_.listen));
    TRY(server_->listen_tcp(ep.host, ep.port));
  }
  register_metrics();
  metrics_.serve(*loop_, cfg_.metrics_listen);
  if (!cfg_.web_listen.empty()) {
    auto web = metrics::HttpServer::start(*loop_, cfg_.web_listen, nullptr);
    if (!web.ok()) return std::move(web).error().wrap("web_listen");
    web_http_ = std::move(web).value();
    web_http_->set_allowed_hosts(cfg_.web_hosts);
    web_http_->set_pages([this](const std::string& url, std::string* type, std::string* body) {
      if (url != "/" && url != "/index.html") return false;
      *type = "text/html; charset=utf-8";
      *body = web_page();
      return true;
    });
    log_info("web view", {{"LISTEN", web_http_->address()}});
  }
  TRY(loop_->exit_on_termination());
  // SIGHUP (systemctl reload): certificates, key and CRL are read again; new handshakes
  // use them, sessions already up carry on.
  TRY_ASSIGN(Source hup, loop_->add_signal(SIGHUP, [this] {
    if (!tls_) {
      log_info("SIGHUP: nothing to reload");
      return;
    }
    // A new ticket key first: sessions resumed from now on were verified under the
    // files read now (a certificate revoked by the new CRL cannot resume).
    if (!cfg_.tls.ticket_key_file.empty())
      if (auto s = tls::write_ticket_key(cfg_.tls.ticket_key_file); !s.ok())
        log_error("SIGHUP: no new TLS ticket key: " + s.error().str());
    if (auto s = tls_->reload(); !s.ok())
      log_error("SIGHUP: TLS files not reloaded; the previous ones stay in use: " +
                s.error().str());
    else
      log_info("SIGHUP: TLS certificates, key and CRL reloaded");
  }));
  sighup_ = std::move(hup);
  loop_->enable_watchdog();
  return {};
}

void Manager::lead() {
  if (auto s = start_region(); !s.ok()) {
    log_error("the region's machines could not be read: " + s.error().str());
    if (leadership_) return step_down("the region's machines could not be read");
  }
  auto t = loop_->add_timer_in(cfg_.broker.heartbeat_interval_us, [this] { periodic(); });
  if (t.ok()) timer_ = std::move(t).value();
  watch_heartbeats();
  start_task_control();
  discovery_->start();
  maintenance_round();
  log_info(leadership_ ? "control plane ready: leading" : "control plane ready",
           {{"SOCKET", cfg_.socket},
            {"LISTEN",
             cfg_.listen.empty() ? "-" : cfg_.listen + ":" + std::to_string(server_->tcp_port())},
            {"TLS", tls_ ? "mutual" : "off"},
            {"METRICS", metrics_.address()},
            {"MACHINES", std::to_string(alloc_.machine_count())},
            {"TASKS", std::to_string(sched_.tasks().size())}});
  if (!leadership_) sd_notify(0, "READY=1");
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
  return identify_caller(c.peer, cfg_.access, weft_gid_, cfg_.socket_group);
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

void Manager::audit(const Caller& who, const std::string& method, const json& p,
                    const Result<json>& r) {
  AuditRecord a;
  a.who = who.who;
  a.role = role_name(who.role);
  a.method = method;
  for (const char* key : {"name", "machine"})
    if (p.is_object() && p.contains(key) && p[key].is_string()) {
      a.target = p[key].get<std::string>().substr(0, 256);
      break;
    }
  a.digest = tls::sha256_hex(p.dump(-1, ' ', false, json::error_handler_t::replace));
  if (r.ok())
    a.result = "ok";
  else
    a.result = std::string(r.error().code == rpc::kPermissionDenied ? "denied: " : "error: ") +
               r.error().str().substr(0, 512);
  if (r.ok() && (method == "job.create" || method == "job.update") && !a.target.empty())
    job_operator_[a.target] = a.who;
  write_audit(a);
}

void Manager::write_audit(const AuditRecord& a) {
  log_info("audit: " + a.who + " " + a.method + " " + a.target + ": " + a.result,
           {{"AUDIT_WHO", a.who},
            {"AUDIT_ROLE", a.role},
            {"AUDIT_METHOD", a.method},
            {"AUDIT_TARGET", a.target},
            {"AUDIT_PARAMS_SHA256", a.digest},
            {"AUDIT_RESULT", a.result}});
  Status written = group_->open();
  if (written.ok()) written = store_->put_audit(a);
  if (!written.ok())
    log_error("audit entry not written to the store (the journal has it): " +
              written.error().str());
}

std::string Manager::job_operator(const std::string& job) {
  if (!job_operators_loaded_) {
    job_operators_loaded_ = true;
    auto rows = store_->audit(0, StateStore::kMaxAudit);  // oldest first
    if (rows.ok())
      for (const auto& r : *rows)
        if (r.result == "ok" && (r.method == "job.create" || r.method == "job.update") &&
            !job_operator_.count(r.target))
          job_operator_[r.target] = r.who;
    // Entries made since this process started are newer than any row: kept as they are.
  }
  auto it = job_operator_.find(job);
  return it == job_operator_.end() ? "an operator no longer in the audit log" : it->second;
}

void Manager::audit_controller(const std::string& job, const std::vector<std::string>& acks,
                               const std::vector<Command>& done) {
  std::string did;
  for (const auto& c : done) {
    if (c.kind == Command::Kind::kPrefetch) continue;
    did += (did.empty() ? "" : ", ") +
           std::string(c.kind == Command::Kind::kStart ? "start " : "stop ") + c.task_id;
    if (did.size() > 400) {
      did += ", ...";
      break;
    }
  }
  if (did.empty()) return;  // acknowledged, nothing done yet (or nothing pending)
  auto spec = sched_.job(job);
  std::string controller = "TaskController";
  if (spec && spec->controller)
    controller += spec->controller->address.empty()
                      ? " (a task of job " + spec->controller->job + ", port " +
                            std::to_string(spec->controller->port) + ")"
                      : " at " + spec->controller->address;
  AuditRecord a;
  // Who acted: the controller, on behalf of the operator who set the job (and with it
  // the controller) up.
  a.who = controller + " for " + job_operator(job);
  a.role = "controller";
  a.method = "taskcontrol.ack";
  a.target = job;
  a.digest = tls::sha256_hex(json(acks).dump());
  a.result = "ok: " + did;
  write_audit(a);
}

Status Manager::claim_session(std::map<MachineId, rpc::Session*>& table, MachineId m,
                              const CallContext& c, const char* daemon, uint64_t interval_us) {
  if (!c.session) return {};
  uint64_t now = now_us();
  auto it = table.find(m);
  if (it != table.end() && it->second != c.session) {
    rpc::Session* old = it->second;
    auto h = heard_.find(old);
    uint64_t heard = h == heard_.end() ? 0 : h->second;
    uint64_t dead_after = (interval_us ? interval_us : cfg_.broker.heartbeat_interval_us) *
                          static_cast<uint64_t>(cfg_.broker.missed_heartbeats);
    const std::string& name = alloc_.spec(m).name;
    if (now - heard < dead_after) {
      log_warn("second session for a connected machine refused",
               {{"MACHINE", name},
                {"DAEMON", daemon},
                {"CONNECTED", old->peer().address},
                {"REFUSED", c.peer.address}});
      return make_error("machine " + name + " already has a " + daemon + " session (from " +
                        old->peer().address + ", heard from " +
                        std::to_string((now - heard) / 1000) +
                        " ms ago); a second one is refused until that one closes or falls silent")
          .with_code(rpc::kConflict);
    }
    log_warn("a silent session replaced by a new one", {{"MACHINE", name},
                                                        {"DAEMON", daemon},
                                                        {"SILENT", old->peer().address},
                                                        {"NEW", c.peer.address}});
    table.erase(it);
    old->close();
  }
  track_session(table, m, c.session);
  if (heard_.emplace(c.session, now).second) {
    rpc::Session* s = c.session;
    s->watch_close([this, s] { heard_.erase(s); });
  } else {
    heard_[c.session] = now;
  }
  return {};
}

Status Manager::persist(const std::set<std::string>& jobs, const std::set<MachineId>& machines) {
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
  profile_dirty_.insert(w.machines.begin(), w.machines.end());
  ready_dirty_.insert(w.machines.begin(), w.machines.end());
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
    auto it = sessions_.find(c.machine);
    if (it == sessions_.end()) continue;  // offline: reconciled when it reports again
    std::string task = c.task_id;
    if (c.kind == Command::Kind::kStart) {
      it->second->call("task.run", c.spec, [this, task](Result<json> r) {
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
      json params = c.spec.value("fetch", json::object());
      params["wait"] = true;
      it->second->call("image.pull", params, [this, task, m, generation](Result<json> r) {
        if (!r.ok())
          log_warn("a machine could not prefetch an image",
                   {{"JOB", task}, {"ERROR", r.error().str()}});
        prefetched(task, generation, m);
      });
    } else {
      it->second->call("task.stop", {{"id", task}}, [task](Result<json> r) {
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

void Manager::tick() {
  uint64_t now = now_us();
  if (lending_) lending_->round(now);
  if (region_services_) region_services_->round();
  std::vector<Command> cmds;
  std::set<MachineId> touched;
  for (MachineId m : check_machines(now)) failures_.went_down(m);
  for (MachineId m : broker_.take_failed()) failures_.went_down(m);
  failures_.count_waiting();
  for (MachineId m : broker_.take_ready(std::exchange(ready_dirty_, {}))) {
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
  auto offered = profiles_offered_.find(m);
  auto state = profile_state_.find(m);
  if (!sidekick_sessions_.count(m)) return why + ": no weft-sidekick session from this machine";
  if (offered != profiles_offered_.end() && !offered->second.count(want))
    return why + ": its weft-sidekick has no profile '" + want + "'";
  if (state != profile_state_.end() && state->second.is_string() &&
      !state->second.get<std::string>().empty())
    return why + ": its weft-sidekick says: " + state->second.get<std::string>().substr(0, 300);
  return why;
}

std::vector<MachineId> Manager::check_machines(uint64_t now) {
  // While etcd refuses the groups, every reply waits: the machines cannot be heard out.
  if (group_->held()) broker_.excuse_silence_until(now);
  if (last_check_us_ && now > last_check_us_ &&
      now - last_check_us_ > cfg_.broker.heartbeat_interval_us) {
    broker_.excuse_silence_until(now);
    log_warn("this control plane was held up; the machines' silence meanwhile is not counted",
             {{"HELD_MS", std::to_string((now - last_check_us_) / 1000)}});
  }
  last_check_us_ = now;
  return broker_.check(now);
}

void Manager::watch_heartbeats() {
  // Between ticks: a machine is declared dead within a quarter of a heartbeat interval
  // of its deadline, not up to a whole interval later. Cheap: the broker looks only at
  // the heartbeats that have expired (Broker::check).
  auto dead = check_machines(now_us());
  if (!dead.empty()) {
    for (MachineId m : dead) failures_.went_down(m);
    kick();
  }
  auto t =
      loop_->add_timer_in(cfg_.broker.heartbeat_interval_us / 4, [this] { watch_heartbeats(); });
  if (t.ok()) watch_ = std::move(t).value();
}

void Manager::periodic() {
  uint64_t t0 = now_us();
  tick();
  metrics_.tick(static_cast<double>(now_us() - t0) / 1e6);
  auto t = loop_->add_timer_in(cfg_.broker.heartbeat_interval_us, [this] { periodic(); });
  if (t.ok()) timer_ = std::move(t).value();
}

void Manager::kick() {
  if (kick_.active() && kicked_) return;  // one tick for every change of this iteration
  kicked_ = true;
  auto d = loop_->add_defer([this] {
    kicked_ = false;
    tick();
  });
  if (d.ok()) kick_ = std::move(d).value();
}

void Manager::register_metrics() {
  metrics_.add([this](metrics::Writer& w) {
    w.family("weft_cp_sessions", "gauge", "Sessions open (machines' daemons and operators).");
    w.sample("weft_cp_sessions", static_cast<double>(server_ ? server_->session_count() : 0));
    w.family("weft_cp_machine_sessions", "gauge", "Machines with a session, by daemon.");
    w.sample("weft_cp_machine_sessions", static_cast<double>(sessions_.size()),
             {{"daemon", "agent"}});
    w.sample("weft_cp_machine_sessions", static_cast<double>(sidekick_sessions_.size()),
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

// Remembers `s` as machine m's session in `table` until it closes.
void track_session(std::map<MachineId, rpc::Session*>& table, MachineId m, rpc::Session* s) {
  if (!s) return;
  auto it = table.find(m);
  if (it != table.end() && it->second == s) return;
  table[m] = s;
  s->watch_close([&table, m, s] {
    if (auto cur = table.find(m); cur != table.end() && cur->second == s) table.erase(cur);
  });
}

void Manager::push_profiles() {
  // Only machines whose pool changed since the last push: the work follows the changes,
  // not the fleet.
  for (MachineId m : std::exchange(profile_dirty_, {})) {
    auto it = sidekick_sessions_.find(m);
    if (it == sidekick_sessions_.end()) continue;
    rpc::Session* s = it->second;
    std::string want = broker_.desired_profile(m);
    auto& pushed = pushed_profile_[m];
    if (want.empty() || want == pushed || broker_.persisted(m).applied_profile == want) continue;
    pushed = want;
    std::string name = alloc_.spec(m).name;
    s->call("profile.apply", {{"profile", want}}, [name, want](Result<json> r) {
      if (!r.ok())
        log_warn("sidekick did not take the profile",
                 {{"MACHINE", name}, {"PROFILE", want}, {"ERROR", r.error().str()}});
    });
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
  auto get = [m](const std::map<MachineId, json>& t) {
    auto it = t.find(m);
    return it == t.end() ? json() : it->second;
  };
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
          {"profile_state", get(profile_state_)},
          {"problems", get(health_problems_)},
          {"controllers", get(controllers_)},
          {"connected", sessions_.count(m) > 0},
          {"sidekick_connected", sidekick_sessions_.count(m) > 0},
          {"unprepared", broker_.unprepared_reason(m)}};
}

Result<MachineId> Manager::machine_of(const json& p, const CallContext&) {
  if (!p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  auto m = broker_.find(p["machine"].get<std::string>());
  if (!m) return field_error("machine", "unknown machine; call machine.register first");
  return *m;
}

Result<MachineId> Manager::own_machine(const json& p, const CallContext& c) {
  // The certificate first: a machine certificate learns nothing of other machines, not
  // even whether an id exists.
  if (!p.is_object() || !p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  TRY(check_machine_identity(c.peer, p["machine"].get<std::string>()));
  return machine_of(p, c);
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

std::string Manager::controller_address(const TaskControllerSpec& c) const {
  for (const auto& t : sched_.tasks_of(c.job)) {
    if (!available(t)) continue;
    auto s = sessions_.find(t.machine);
    if (s == sessions_.end()) continue;
    const rpc::Peer& peer = s->second->peer();
    // An agent on this host (a Unix socket) serves on loopback.
    std::string host = peer.is_unix || peer.host.empty() ? "127.0.0.1" : peer.host;
    if (host.find(':') != std::string::npos) host = "[" + host + "]";
    return host + ":" + std::to_string(c.port);
  }
  return "";  // none ready: unreachable until one is
}

}  // namespace weft::cp
