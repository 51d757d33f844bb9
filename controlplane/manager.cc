#include "controlplane/manager.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <set>

#include "common/fs.h"
#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

uint64_t now_us() {
  return now_monotonic_us();  // the scheduler and broker need a steady clock
}

json task_json(const TaskRecord& t, const Allocator& a) {
  return {{"id", t.id},
          {"job", t.job},
          {"index", t.index},
          {"generation", t.generation},
          {"machine", a.spec(t.machine).name},
          {"state", task_state_name(t.state)},
          {"message", t.message}};
}

Manager::Manager(CpConfig cfg, std::unique_ptr<EventLoop> loop)
    : cfg_(std::move(cfg)),
      loop_(std::move(loop)),
      broker_(alloc_, cfg_.broker),
      sched_(alloc_, cfg_.limits) {}

Result<std::unique_ptr<Manager>> Manager::create(CpConfig cfg) {
  TRY_ASSIGN(auto loop, EventLoop::create());
  return std::unique_ptr<Manager>(new Manager(std::move(cfg), std::move(loop)));
}

Manager::~Manager() {
  server_.reset();
}

Status Manager::start() {
  TRY(mkdir_p(cfg_.state_dir, 0750));
  TRY_ASSIGN(store_, StateStore::open(cfg_.state_dir + "/controlplane.db"));
  TRY_CTX(store_->restore(alloc_, broker_, sched_, now_us()), "restoring the control plane state");
  sched_.set_ready_check(
      [this](MachineId m) { return broker_.usable(m) && broker_.state_of(m) != "preparing"; });
  sched_.set_entitlement_dc([this](EntitlementId e) {
    auto it = broker_.entitlements().find(e);
    return it == broker_.entitlements().end() ? std::string() : it->second.dc;
  });
  weft_gid_ = group_gid(cfg_.socket_group);
  register_methods();
  server_ = std::make_unique<rpc::Server>(*loop_, &methods_);
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
  auto t = loop_->add_timer_in(cfg_.broker.heartbeat_interval_us, [this] { tick(); });
  if (t.ok()) timer_ = std::move(t).value();
  log_info("control plane ready",
           {{"SOCKET", cfg_.socket},
            {"LISTEN",
             cfg_.listen.empty() ? "-" : cfg_.listen + ":" + std::to_string(server_->tcp_port())},
            {"TLS", tls_ ? "mutual" : "off"},
            {"MACHINES", std::to_string(alloc_.machine_count())},
            {"TASKS", std::to_string(sched_.tasks().size())}});
  sd_notify(0, "READY=1");
  return {};
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
  Caller w;
  const rpc::Peer& p = c.peer;
  if (p.is_unix) {
    w.unix_socket = true;
    w.who = "uid " + std::to_string(p.uid) + " (pid " + std::to_string(p.pid) + ")";
    if (rpc::require_privileged(p, weft_gid_, cfg_.socket_group, "calling the control plane")
            .ok()) {
      w.role = Role::kAdmin;
      w.machine = true;
    }
    return w;
  }
  if (!p.tls) {  // plaintext TCP: loopback tests or insecure_listen; machines only
    w.who = p.address;
    w.machine = true;
    return w;
  }
  w.id = &p.identity;
  w.who = p.identity.subject;
  w.role = cfg_.access.role_of(p.identity);
  w.machine = cfg_.access.is_machine(p.identity);
  return w;
}

Status Manager::permit(const Caller& who, int access, const std::string& method) const {
  static const Role kNeeds[] = {Role::kNone, Role::kNone, Role::kViewer, Role::kOperator,
                                Role::kAdmin};
  bool ok = access == kMachineCall ? who.machine : who.role >= kNeeds[access];
  if (ok) return {};
  std::string why;
  if (who.unix_socket)
    why = "on the Unix socket only root and the '" + cfg_.socket_group + "' group are served";
  else if (!who.id)
    why = "over plaintext TCP only machine calls are served; " + method +
          " needs a TLS client certificate";
  else if (access == kMachineCall)
    why = method + " is a machine call: the certificate must match access.machine";
  else
    why = method + " needs the " + role_name(kNeeds[access]) + " role; the certificate's role is " +
          role_name(who.role);
  log_warn("call refused", {{"PEER", who.who}, {"METHOD", method}, {"WHY", why}});
  return make_error(who.who + ": " + why).with_code(rpc::kPermissionDenied);
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
  log_info("audit: " + a.who + " " + method + " " + a.target + ": " + a.result,
           {{"AUDIT_WHO", a.who},
            {"AUDIT_ROLE", a.role},
            {"AUDIT_METHOD", method},
            {"AUDIT_TARGET", a.target},
            {"AUDIT_PARAMS_SHA256", a.digest},
            {"AUDIT_RESULT", a.result}});
  if (auto s = store_->put_audit(a); !s.ok())
    log_error("audit entry not written to the store (the journal has it): " + s.error().str());
}

Status Manager::claim_session(std::map<MachineId, rpc::Session*>& table, MachineId m,
                              const CallContext& c, const char* daemon) {
  if (!c.session) return {};
  uint64_t now = now_us();
  auto it = table.find(m);
  if (it != table.end() && it->second != c.session) {
    rpc::Session* old = it->second;
    auto h = heard_.find(old);
    uint64_t heard = h == heard_.end() ? 0 : h->second;
    uint64_t dead_after =
        cfg_.broker.heartbeat_interval_us * static_cast<uint64_t>(cfg_.broker.missed_heartbeats);
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
  TRY(store_->begin());
  auto fail = [this](Status s) {
    store_->rollback();
    return s;
  };
  for (const auto& [id, e] : broker_.entitlements())
    if (auto s = store_->put_entitlement(id, e); !s.ok()) return fail(s);
  std::set<MachineId> all = machines;
  for (MachineId m : sched_.take_pool_changes()) all.insert(m);
  // The jobs' machines too: a replacement may have taken a free machine into the
  // entitlement.
  for (const auto& name : jobs)
    for (MachineId m : alloc_.placement(name)) all.insert(m);
  for (MachineId m : all)
    if (auto s = store_->put_machine(m, broker_.persisted(m), alloc_.entitlement_of(m)); !s.ok())
      return fail(s);
  for (const auto& name : jobs) {
    bool found = false;
    for (const auto& j : sched_.persisted_jobs())
      if (j.spec.name == name) {
        found = true;
        if (auto s = store_->put_job(j, alloc_.request(name), alloc_.placement(name)); !s.ok())
          return fail(s);
      }
    if (!found) {
      if (auto s = store_->delete_job(name); !s.ok()) return fail(s);
      continue;
    }
    for (const auto& t : sched_.tasks_of(name))
      if (auto s = store_->put_task(t); !s.ok()) return fail(s);
  }
  if (auto s = store_->put_task_seq(sched_.task_seq()); !s.ok()) return fail(s);
  if (auto s = store_->put_events(broker_.take_new_events()); !s.ok()) return fail(s);
  return store_->commit();
}

Status Manager::persist_commands(const std::vector<Command>& cmds) {
  std::set<std::string> jobs;
  std::set<MachineId> machines;
  for (const auto& c : cmds) {
    auto it = sched_.tasks().find(c.task_id);
    if (it != sched_.tasks().end()) jobs.insert(it->second.job);
    machines.insert(c.machine);
  }
  return persist(jobs, machines);
}

void Manager::send(const std::vector<Command>& cmds) {
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

void Manager::start_refused(const std::string& task, const Error& e, bool bad_spec) {
  // The agent's words, with the field it named: what job.show and weftctl print.
  std::string message = e.field.empty() ? e.message : e.field + ": " + e.message;
  auto cmds = sched_.start_refused(task, message, bad_spec, now_us());
  auto changed = sched_.take_reported_changes();
  if (changed.empty()) return;  // not awaited any more
  std::set<MachineId> machines;
  for (const auto& c : cmds) machines.insert(c.machine);
  if (auto s = persist(changed, machines); !s.ok())
    log_error("cannot write state: " + s.error().str());
  send(cmds);
}

void Manager::tick() {
  uint64_t now = now_us();
  std::vector<Command> cmds;
  std::set<MachineId> touched;
  for (MachineId m : broker_.check(now)) {
    auto c = sched_.machine_down(m, now);
    cmds.insert(cmds.end(), c.begin(), c.end());
    touched.insert(m);
  }
  for (MachineId m : broker_.take_failed()) {
    auto c = sched_.machine_down(m, now);
    cmds.insert(cmds.end(), c.begin(), c.end());
    touched.insert(m);
  }
  for (MachineId m : broker_.take_ready()) {
    auto c = sched_.machine_ready(m, now);
    cmds.insert(cmds.end(), c.begin(), c.end());
  }
  auto c = sched_.tick(now);
  cmds.insert(cmds.end(), c.begin(), c.end());
  auto pruned = sched_.prune(now, cfg_.ended_task_retention_us);
  if (!pruned.empty()) {
    if (auto s = store_->delete_tasks(pruned); !s.ok())
      log_error("cannot forget ended tasks: " + s.error().str());
  }
  std::set<std::string> jobs;
  for (const auto& [id, t] : sched_.tasks())
    if (touched.count(t.machine)) jobs.insert(t.job);
  for (const auto& cmd : cmds)
    if (auto it = sched_.tasks().find(cmd.task_id); it != sched_.tasks().end())
      jobs.insert(it->second.job);
  if (auto s = persist(jobs, touched); !s.ok()) log_error("cannot write state: " + s.error().str());
  send(cmds);
  auto t = loop_->add_timer_in(cfg_.broker.heartbeat_interval_us, [this] { tick(); });
  if (t.ok()) timer_ = std::move(t).value();
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
  for (const auto& [m, s] : sidekick_sessions_) {
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
          {"sidekick_connected", sidekick_sessions_.count(m) > 0}};
}

Result<MachineId> Manager::machine_of(const json& p, const CallContext&) {
  if (!p.contains("machine") || !p["machine"].is_string())
    return field_error("machine", "the machine id is required");
  auto m = broker_.find(p["machine"].get<std::string>());
  if (!m) return field_error("machine", "unknown machine; call machine.register first");
  return *m;
}

Result<MachineId> Manager::own_machine(const json& p, const CallContext& c) {
  TRY_ASSIGN(MachineId m, machine_of(p, c));
  TRY(check_machine_identity(c.peer, p["machine"].get<std::string>()));
  return m;
}

}  // namespace weft::cp
