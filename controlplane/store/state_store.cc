#include "controlplane/store/state_store.h"

#include <limits>

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/task_spec.h"
#include "controlplane/store/notes.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {

const std::vector<std::string> kMigrations = {
    R"(CREATE TABLE entitlements (id INTEGER PRIMARY KEY, spec TEXT NOT NULL);
       CREATE TABLE machines (idx INTEGER PRIMARY KEY, machine TEXT NOT NULL UNIQUE,
                              entitlement INTEGER NOT NULL, state TEXT NOT NULL);
       CREATE TABLE jobs (name TEXT PRIMARY KEY, spec TEXT NOT NULL, generation INTEGER NOT NULL,
                          stopping INTEGER NOT NULL, request TEXT, placement TEXT NOT NULL);
       CREATE TABLE tasks (id TEXT PRIMARY KEY, job TEXT NOT NULL, idx INTEGER NOT NULL,
                           generation INTEGER NOT NULL, machine INTEGER NOT NULL,
                           state TEXT NOT NULL, since_us INTEGER NOT NULL);
       CREATE INDEX tasks_job ON tasks (job);
       CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);)",
    // since_us held the monotonic clock, which restarts at boot: the wall-clock time
    // goes beside it (0 in older rows: their age is unknown and counts from the restore).
    R"(ALTER TABLE tasks ADD COLUMN since_wall_us INTEGER NOT NULL DEFAULT 0;)",
    // Why a task failed when its machine refused it, and whether it waits for an update;
    // unavailability events (machines dead, failed, drained, back), bounded.
    R"(ALTER TABLE tasks ADD COLUMN message TEXT NOT NULL DEFAULT '';
       ALTER TABLE tasks ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
       CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_wall_us INTEGER NOT NULL,
                            machine TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);)",
    // The audit log: every operator call that changes the cluster (or was refused).
    R"(CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_wall_us INTEGER NOT NULL,
                           who TEXT NOT NULL, role TEXT NOT NULL, method TEXT NOT NULL,
                           target TEXT NOT NULL, digest TEXT NOT NULL, result TEXT NOT NULL);)",
    // Planned maintenance events (controlplane/maintenance/maintenance.h), one JSON row each.
    R"(CREATE TABLE maintenance (id INTEGER PRIMARY KEY, event TEXT NOT NULL);)",
    // A task's named ports on its machine (docs/services.md), as a JSON object.
    R"(ALTER TABLE tasks ADD COLUMN ports TEXT NOT NULL DEFAULT '{}';)",
    // The features' notes (controlplane/store/notes.h); whether a guest's task was
    // taken back (its room given to its machine's owner: TaskRecord::preempted).
    R"(CREATE TABLE notes (key TEXT PRIMARY KEY, value TEXT NOT NULL);
       ALTER TABLE tasks ADD COLUMN preempted INTEGER NOT NULL DEFAULT 0;)",
};

TaskState state_from(const std::string& s) {
  return weft::parse_task_state(s).value_or(TaskState::kLost);
}

// The sqlite store (WAL): one file on the control plane's disk.
class SqliteStore final : public StateStore {
 public:
  explicit SqliteStore(std::unique_ptr<Db> db) : db_(std::move(db)) {}
  std::string kind() const override { return "sqlite"; }
  Status begin() override { return batch_ ? db_->exec("SAVEPOINT w") : db_->begin(); }
  Status commit() override { return batch_ ? db_->exec("RELEASE w") : db_->commit(); }
  void rollback() override {
    if (!batch_) return db_->rollback();
    (void)db_->exec("ROLLBACK TO w");
    (void)db_->exec("RELEASE w");
  }
  Status open_batch() override {
    if (batch_) return {};
    TRY(db_->begin());
    batch_ = true;
    return {};
  }
  Status commit_batch() override {
    if (!batch_) return {};
    batch_ = false;
    // sqlite may have rolled the whole transaction back itself (a full disk, an I/O
    // error inside a savepoint): then nothing of the group is there to commit.
    if (sqlite3_get_autocommit(db_->raw()))
      return make_error("sqlite rolled the group's transaction back");
    return db_->commit();
  }
  bool in_batch() const override { return batch_; }
  void abandon_batch() override {
    batch_ = false;
    db_->rollback();
  }
  Status put_entitlement(EntitlementId id, const EntitlementSpec& e) override;
  Status delete_entitlement(EntitlementId id) override;
  Status put_machine(MachineId idx, const Broker::Persisted& m, EntitlementId ent) override;
  Status put_job(const Scheduler::PersistedJob& j, const std::optional<Request>& req,
                 const std::vector<MachineId>& placement,
                 const std::vector<std::vector<uint16_t>>& dynamic_ports) override;
  Status delete_job(const std::string& name) override;
  Status put_task(const TaskRecord& t) override;
  Status delete_tasks(const std::vector<std::string>& ids) override;
  Status put_task_seq(uint64_t seq) override;
  Status probe_write() override;
  Status put_events(const std::vector<Unavailability>& events) override;
  Status put_maintenance(const MaintenanceEvent& e) override;
  Status delete_maintenance(uint64_t id) override;
  Result<std::vector<MaintenanceEvent>> maintenance() override;
  Status put_note(const std::string& key, const json& value) override;
  Status delete_note(const std::string& key) override;
  Result<std::map<std::string, json>> notes() override;
  Status put_audit(const AuditRecord& r) override;
  Result<std::vector<AuditRecord>> audit(int64_t since_wall_us, size_t limit) override;
  Result<StoredState> load() override;

 private:
  bool batch_ = false;
  std::unique_ptr<Db> db_;
  uint64_t audit_writes_ = 0;
};

}  // namespace

Result<std::unique_ptr<StateStore>> StateStore::open(const std::string& path) {
  TRY_ASSIGN(auto db, Db::open(path));
  TRY_CTX(db->migrate(kMigrations), "control plane database");
  return std::unique_ptr<StateStore>(new SqliteStore(std::move(db)));
}

json StateStore::entitlement_row(const EntitlementSpec& e) {
  return {{"name", e.name},
          {"quota", e.quota},
          {"profile", e.profile},
          {"dc", e.dc},
          {"owners", e.owners},
          {"grants", to_json(e.grants)},
          {"rebalance_paused", e.rebalance_paused}};
}

json StateStore::machine_row(const Broker::Persisted& m) {
  return {{"dc", m.info.dc},
          {"domain", m.info.domain},
          {"type", m.info.type},
          {"cpu_milli", m.info.capacity.cpu_milli},
          {"mem_mb", m.info.capacity.mem_mb},
          {"port_first", m.info.port_first},
          {"port_last", m.info.port_last},
          {"drained", m.drained},
          {"applied_profile", m.applied_profile},
          {"removed", m.removed},
          {"pinned", m.pinned}};
}

Status SqliteStore::put_entitlement(EntitlementId id, const EntitlementSpec& e) {
  TRY_ASSIGN(Stmt s,
             db_->prepare("INSERT OR REPLACE INTO entitlements (id, spec) VALUES (?1, ?2)"));
  s.bind(1, int64_t{id}).bind(2, entitlement_row(e).dump());
  return s.run();
}

Status SqliteStore::delete_entitlement(EntitlementId id) {
  TRY_ASSIGN(Stmt s, db_->prepare("DELETE FROM entitlements WHERE id = ?1"));
  s.bind(1, int64_t{id});
  return s.run();
}

Status SqliteStore::put_machine(MachineId idx, const Broker::Persisted& m, EntitlementId ent) {
  TRY_ASSIGN(Stmt s, db_->prepare("INSERT OR REPLACE INTO machines (idx, machine, entitlement, "
                                  "state) VALUES (?1, ?2, ?3, ?4)"));
  s.bind(1, int64_t{idx}).bind(2, m.info.id).bind(3, int64_t{ent}).bind(4, machine_row(m).dump());
  return s.run();
}

Status SqliteStore::put_job(const Scheduler::PersistedJob& j, const std::optional<Request>& req,
                            const std::vector<MachineId>& placement,
                            const std::vector<std::vector<uint16_t>>& dynamic_ports) {
  TRY_ASSIGN(Stmt s, db_->prepare("INSERT OR REPLACE INTO jobs (name, spec, generation, "
                                  "stopping, request, placement) VALUES (?1,?2,?3,?4,?5,?6)"));
  s.bind(1, j.spec.name)
      .bind(2, job_row_spec(j).dump())
      .bind(3, static_cast<int64_t>(j.generation))
      .bind(4, int64_t{j.stopping});
  if (req)
    s.bind(5, request_to_json(*req, dynamic_ports).dump());
  else
    s.bind(5, nullptr);
  s.bind(6, json(placement).dump());
  return s.run();
}

Status SqliteStore::delete_job(const std::string& name) {
  for (const char* sql : {"DELETE FROM jobs WHERE name = ?1", "DELETE FROM tasks WHERE job = ?1"}) {
    TRY_ASSIGN(Stmt s, db_->prepare(sql));
    s.bind(1, name);
    TRY(s.run());
  }
  return {};
}

int64_t StateStore::wall_of(uint64_t mono_us) const {
  uint64_t mono = mono_(), wall = wall_();
  uint64_t age = mono > mono_us ? mono - mono_us : 0;
  return static_cast<int64_t>(wall > age ? wall - age : 1);
}

uint64_t StateStore::mono_of(uint64_t wall_us, uint64_t wall_now, uint64_t mono_now) {
  // The age from the wall clock, applied to this boot's monotonic clock; a wall clock
  // stepped back (or an old row's 0) counts as age 0, never as a negative age.
  uint64_t age = wall_us > 0 && wall_now > wall_us ? wall_now - wall_us : 0;
  return mono_now > age ? mono_now - age : 0;
}

Status SqliteStore::put_task(const TaskRecord& t) {
  TRY_ASSIGN(Stmt s,
             // An upsert: a known task's row is updated in place (a state change touches
             // no index), where INSERT OR REPLACE deleted it and inserted it again, both
             // indexes with it. job and idx never change for an id.
             db_->prepare("INSERT INTO tasks (id, job, idx, generation, machine, state, "
                          "since_us, since_wall_us, message, held, ports, preempted) "
                          "VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12) "
                          "ON CONFLICT(id) DO UPDATE SET generation = excluded.generation, "
                          "machine = excluded.machine, state = excluded.state, "
                          "since_us = excluded.since_us, since_wall_us = excluded.since_wall_us, "
                          "message = excluded.message, held = excluded.held, "
                          "ports = excluded.ports, preempted = excluded.preempted"));
  s.bind(1, t.id).bind(2, t.job).bind(3, int64_t{t.index});
  s.bind(4, static_cast<int64_t>(t.generation)).bind(5, int64_t{t.machine});
  s.bind(6, std::string(task_state_name(t.state))).bind(7, static_cast<int64_t>(t.since_us));
  s.bind(8, wall_of(t.since_us));
  s.bind(9, t.message).bind(10, int64_t{t.held});
  s.bind(11, task_ports_json(t.ports).dump());
  s.bind(12, int64_t{t.preempted});
  return s.run();
}

Status SqliteStore::put_events(const std::vector<Unavailability>& events) {
  if (events.empty()) return {};
  for (const auto& e : events) {
    TRY_ASSIGN(Stmt s, db_->prepare("INSERT INTO events (at_wall_us, machine, kind, detail) "
                                    "VALUES (?1, ?2, ?3, ?4)"));
    s.bind(1, wall_of(e.at_us));
    s.bind(2, e.machine).bind(3, e.kind).bind(4, e.detail);
    TRY(s.run());
  }
  TRY_ASSIGN(Stmt trim, db_->prepare("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM "
                                     "events) - ?1"));
  trim.bind(1, static_cast<int64_t>(UnavailabilityLog::kMaxEvents));
  return trim.run();
}

Status SqliteStore::put_maintenance(const MaintenanceEvent& e) {
  TRY_ASSIGN(Stmt s,
             db_->prepare("INSERT OR REPLACE INTO maintenance (id, event) VALUES (?1, ?2)"));
  s.bind(1, static_cast<int64_t>(e.id)).bind(2, to_json(e).dump());
  return s.run();
}

Status SqliteStore::delete_maintenance(uint64_t id) {
  TRY_ASSIGN(Stmt s, db_->prepare("DELETE FROM maintenance WHERE id = ?1"));
  s.bind(1, static_cast<int64_t>(id));
  return s.run();
}

Result<std::vector<MaintenanceEvent>> SqliteStore::maintenance() {
  std::vector<MaintenanceEvent> out;
  TRY_ASSIGN(Stmt s, db_->prepare("SELECT event FROM maintenance ORDER BY id"));
  for (;;) {
    TRY_ASSIGN(bool row, s.step());
    if (!row) break;
    auto e = maintenance_from_json(json::parse(s.col_text(0), nullptr, false));
    if (!e.ok()) return e.error();
    out.push_back(std::move(e).value());
  }
  return out;
}

Status SqliteStore::put_note(const std::string& key, const json& value) {
  TRY_ASSIGN(Stmt s, db_->prepare("INSERT OR REPLACE INTO notes (key, value) VALUES (?1, ?2)"));
  s.bind(1, key).bind(2, value.dump(-1, ' ', false, json::error_handler_t::replace));
  return s.run();
}

Status SqliteStore::delete_note(const std::string& key) {
  TRY_ASSIGN(Stmt s, db_->prepare("DELETE FROM notes WHERE key = ?1"));
  s.bind(1, key);
  return s.run();
}

Result<std::map<std::string, json>> SqliteStore::notes() {
  std::map<std::string, json> out;
  TRY_ASSIGN(Stmt s, db_->prepare("SELECT key, value FROM notes"));
  for (;;) {
    TRY_ASSIGN(bool row, s.step());
    if (!row) break;
    std::string key = s.col_text(0);
    json v = json::parse(s.col_text(1), nullptr, false);
    if (v.is_discarded() || !Notes::valid_key(key)) {
      log_warn("a stored note is not readable: left out", {{"KEY", key}});
      continue;
    }
    out.emplace(std::move(key), std::move(v));
  }
  return out;
}

Status SqliteStore::delete_tasks(const std::vector<std::string>& ids) {
  TRY(begin());
  for (const auto& id : ids) {
    auto st = db_->prepare("DELETE FROM tasks WHERE id = ?1");
    if (!st.ok()) {
      rollback();
      return st.error();
    }
    st->bind(1, id);
    if (auto r = st->run(); !r.ok()) {
      rollback();
      return r;
    }
  }
  return commit();
}

Status SqliteStore::put_task_seq(uint64_t seq) {
  TRY_ASSIGN(Stmt s,
             db_->prepare("INSERT OR REPLACE INTO meta (key, value) VALUES ('task_seq', ?1)"));
  s.bind(1, std::to_string(seq));
  return s.run();
}

Status SqliteStore::probe_write() {
  TRY_ASSIGN(Stmt s,
             db_->prepare("INSERT OR REPLACE INTO meta (key, value) VALUES ('write_probe', ?1)"));
  s.bind(1, std::to_string(wall_now()));
  return s.run();
}

Status SqliteStore::put_audit(const AuditRecord& r) {
  TRY_ASSIGN(Stmt s, db_->prepare("INSERT INTO audit (at_wall_us, who, role, method, target, "
                                  "digest, result) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  s.bind(1, r.at_wall_us ? r.at_wall_us : static_cast<int64_t>(wall_now()))
      .bind(2, r.who)
      .bind(3, r.role)
      .bind(4, r.method)
      .bind(5, r.target)
      .bind(6, r.digest)
      .bind(7, r.result);
  TRY(s.run());
  // Bounded: the oldest rows go once the table holds more than kMaxAudit (checked every
  // 1,000 rows, so the table never exceeds it by more than that).
  if (++audit_writes_ % 1000 == 0) {
    TRY_ASSIGN(Stmt d, db_->prepare("DELETE FROM audit WHERE seq <= (SELECT MAX(seq) FROM audit) "
                                    "- ?1"));
    d.bind(1, static_cast<int64_t>(kMaxAudit));
    TRY(d.run());
  }
  return {};
}

Result<std::vector<AuditRecord>> SqliteStore::audit(int64_t since_wall_us, size_t limit) {
  TRY_ASSIGN(Stmt s, db_->prepare("SELECT seq, at_wall_us, who, role, method, target, digest, "
                                  "result FROM (SELECT * FROM audit WHERE at_wall_us >= ?1 "
                                  "ORDER BY seq DESC LIMIT ?2) ORDER BY seq"));
  s.bind(1, since_wall_us).bind(2, static_cast<int64_t>(limit));
  std::vector<AuditRecord> out;
  for (;;) {
    TRY_ASSIGN(bool row, s.step());
    if (!row) break;
    out.push_back({s.col_int(0), s.col_int(1), s.col_text(2), s.col_text(3), s.col_text(4),
                   s.col_text(5), s.col_text(6), s.col_text(7)});
  }
  return out;
}

Result<StoredState> SqliteStore::load() {
  StoredState st;
  {
    TRY_ASSIGN(Stmt s, db_->prepare("SELECT id, spec FROM entitlements ORDER BY id"));
    for (;;) {
      TRY_ASSIGN(bool row, s.step());
      if (!row) break;
      st.entitlements.emplace_back(static_cast<EntitlementId>(s.col_int(0)),
                                   json::parse(s.col_text(1), nullptr, false));
    }
  }
  {
    TRY_ASSIGN(Stmt s,
               db_->prepare("SELECT idx, machine, entitlement, state FROM machines ORDER BY idx"));
    for (;;) {
      TRY_ASSIGN(bool row, s.step());
      if (!row) break;
      st.machines.push_back({static_cast<MachineId>(s.col_int(0)), s.col_text(1),
                             static_cast<EntitlementId>(s.col_int(2)),
                             json::parse(s.col_text(3), nullptr, false)});
    }
  }
  {
    TRY_ASSIGN(Stmt s,
               db_->prepare("SELECT spec, generation, stopping, request, placement FROM jobs"));
    for (;;) {
      TRY_ASSIGN(bool row, s.step());
      if (!row) break;
      StoredState::Job j;
      j.spec = json::parse(s.col_text(0), nullptr, false);
      j.generation = static_cast<uint64_t>(s.col_int(1));
      j.stopping = s.col_int(2) != 0;
      if (!s.col_null(3)) j.request = json::parse(s.col_text(3), nullptr, false);
      j.placement = json::parse(s.col_text(4), nullptr, false);
      st.jobs.push_back(std::move(j));
    }
  }
  {
    TRY_ASSIGN(Stmt s, db_->prepare("SELECT id, job, idx, generation, machine, state, since_us, "
                                    "since_wall_us, message, held, ports, preempted FROM tasks"));
    for (;;) {
      TRY_ASSIGN(bool row, s.step());
      if (!row) break;
      StoredState::Task t;
      t.record.id = s.col_text(0);
      t.record.job = s.col_text(1);
      t.record.index = static_cast<int>(s.col_int(2));
      t.record.generation = static_cast<uint64_t>(s.col_int(3));
      t.record.machine = static_cast<MachineId>(s.col_int(4));
      t.record.state = state_from(s.col_text(5));
      t.since_wall_us = s.col_int(7);
      t.record.message = s.col_text(8);
      t.record.held = s.col_int(9) != 0;
      t.record.ports = task_ports_from(json::parse(s.col_text(10), nullptr, false));
      t.record.preempted = s.col_int(11) != 0;
      st.tasks.push_back(std::move(t));
    }
  }
  {
    TRY_ASSIGN(Stmt s, db_->prepare("SELECT at_wall_us, machine, kind, detail FROM events "
                                    "ORDER BY seq"));
    for (;;) {
      TRY_ASSIGN(bool row, s.step());
      if (!row) break;
      st.events.push_back({s.col_int(0), s.col_text(1), s.col_text(2), s.col_text(3)});
    }
  }
  TRY_ASSIGN(Stmt m, db_->prepare("SELECT value FROM meta WHERE key = 'task_seq'"));
  TRY_ASSIGN(bool row, m.step());
  if (row) st.task_seq = std::strtoull(m.col_text(0).c_str(), nullptr, 10);
  return st;
}

json StateStore::job_row_spec(const Scheduler::PersistedJob& p) const {
  json j = job_spec_to_json(p.spec);
  if (!(p.progress == JobProgress{}))
    j["progress"] = progress_json(p.progress, [this](uint64_t mono) { return wall_of(mono); });
  if (!secrets_) return j;
  // The revisions' specs hold the job's secrets too: sealed as the spec's are.
  if (j.contains("progress") && j["progress"].contains("revisions"))
    for (auto& r : j["progress"]["revisions"])
      r["spec"] = seal_job_secrets(std::move(r["spec"]), *secrets_);
  return seal_job_secrets(std::move(j), *secrets_);
}

Status StateStore::restore(Allocator& alloc, Broker& broker, Scheduler& sched, uint64_t now) {
  TRY_ASSIGN(StoredState st, load());
  // Secret values are opened here: a row the key file cannot open stops the start (the
  // control plane cannot run a job whose secrets it cannot read, nor drop them).
  secrets_stale_ = false;
  for (auto& j : st.jobs) {
    if (!j.spec.is_object()) continue;
    if (secrets_ && !job_secrets_current(j.spec, *secrets_)) secrets_stale_ = true;
    if (std::string where = first_secret(j.spec); !secrets_ && !where.empty())
      return make_error(where +
                        " is a secret in the stored state, and this control plane has no "
                        "secrets_key: secrets are kept sealed at rest (set secrets_key to the "
                        "key file the packages made, /etc/weft/secrets.key; docs/security.md)");
    TRY_ASSIGN(j.spec, open_job_secrets(std::move(j.spec), secrets_.get()));
    if (j.spec.contains("progress") && j.spec["progress"].is_object() &&
        j.spec["progress"].contains("revisions") && j.spec["progress"]["revisions"].is_array())
      for (auto& r : j.spec["progress"]["revisions"])
        if (r.is_object() && r.contains("spec")) {
          if (secrets_ && !job_secrets_current(r["spec"], *secrets_)) secrets_stale_ = true;
          TRY_ASSIGN(r["spec"], open_job_secrets(std::move(r["spec"]), secrets_.get()));
        }
  }
  return apply(std::move(st), alloc, broker, sched, now, wall_now());
}

Status StateStore::apply(StoredState st, Allocator& alloc, Broker& broker, Scheduler& sched,
                         uint64_t now, uint64_t wall) {
  try {
    return apply_rows(std::move(st), alloc, broker, sched, now, wall);
  } catch (const std::exception& e) {  // a stored row of the wrong type
    return make_error(std::string("corrupt stored state: ") + e.what());
  }
}

Status StateStore::apply_rows(StoredState st, Allocator& alloc, Broker& broker, Scheduler& sched,
                              uint64_t now, uint64_t wall) {
  for (const auto& [id, j] : st.entitlements) {
    if (!j.is_object()) return make_error("corrupt entitlement row");
    EntitlementSpec e{j.value("name", ""),
                      j.value("quota", size_t{0}),
                      j.value("profile", ""),
                      j.value("dc", ""),
                      {}};
    if (auto o = j.find("owners"); o != j.end() && o->is_array())
      for (const auto& v : *o)
        if (v.is_string()) e.owners.push_back(v.get<std::string>());
    // Rows from before grants existed have none: the restricted default.
    if (auto g = j.find("grants"); g != j.end()) {
      auto grants = parse_task_grants(*g, "");
      if (!grants.ok()) return make_error("corrupt entitlement row: " + grants.error().str());
      e.grants = std::move(grants).value();
    }
    e.rebalance_paused = j.value("rebalance_paused", false);
    broker.entitlements().restore(id, e);
  }
  for (const auto& m : st.machines) {
    const json& j = m.state;
    if (!j.is_object()) return make_error("corrupt machine row");
    MachineInfo info{m.machine,
                     j.value("dc", ""),
                     j.value("domain", ""),
                     j.value("type", ""),
                     {j.value("cpu_milli", int64_t{0}), j.value("mem_mb", int64_t{0})}};
    if (auto a = j.find("port_first"); a != j.end() && a->is_number_unsigned() && *a <= 65535)
      info.port_first = a->get<uint16_t>();
    if (auto b = j.find("port_last"); b != j.end() && b->is_number_unsigned() && *b <= 65535)
      info.port_last = b->get<uint16_t>();
    TRY_ASSIGN(MachineId id, broker.register_machine(info, now));
    if (id != m.idx) return make_error("machine " + info.id + " came back with another index");
    TRY(alloc.assign(id, m.entitlement));
    TRY(broker.drain(info.id, j.value("drained", false), now));
    TRY(broker.profile_applied(info.id, j.value("applied_profile", "")));
    if (j.value("removed", false)) broker.set_removed(id, true);
    if (auto pin = j.find("pinned"); pin != j.end() && pin->is_boolean() && pin->get<bool>())
      alloc.pin(id, true);
  }
  for (const auto& j : st.jobs) {
    TRY_ASSIGN(JobSpec spec, stored_job_spec(j.spec, [&broker](EntitlementId id) {
                 return broker.entitlements().count(id) ? broker.entitlements().spec(id).name
                                                        : std::string();
               }));
    if (j.request) {
      TRY_ASSIGN(Request r, request_from_json(*j.request));
      if (!j.placement.is_array()) return make_error("corrupt placement of job " + spec.name);
      std::vector<MachineId> placement;
      for (const auto& v : j.placement) {
        if (!v.is_number_unsigned()) return make_error("corrupt placement of job " + spec.name);
        placement.push_back(v.get<MachineId>());
      }
      TRY(alloc.restore(r, placement, request_dynamic_ports(*j.request)));
    }
    JobProgress progress;
    if (j.spec.contains("progress"))
      progress = progress_from_json(j.spec["progress"], [&](int64_t at) {
        return at > 0 ? mono_of(static_cast<uint64_t>(at), wall, now) : uint64_t{0};
      });
    sched.handover().restore_job({spec, j.generation, j.stopping, progress});
  }
  for (auto& t : st.tasks) {
    TaskRecord r = std::move(t.record);
    r.since_us = mono_of(static_cast<uint64_t>(t.since_wall_us), wall, now);
    // A guest whose room was taken back holds nothing where it still stops.
    if (r.preempted && r.state == TaskState::kStopping)
      alloc.restore_evicted(r.job, r.index, r.machine);
    sched.handover().restore_task(r);
  }
  std::vector<Unavailability> events;
  for (auto& e : st.events)
    events.push_back({mono_of(static_cast<uint64_t>(e.at_wall_us), wall, now), std::move(e.machine),
                      std::move(e.kind), std::move(e.detail)});
  broker.unavailability().restore(std::move(events));
  if (st.task_seq) sched.set_task_seq(*st.task_seq);
  sched.handover().finish_restore();
  return {};
}

Status copy_state(StateStore& from, StateStore& to) {
  Allocator alloc;
  Broker broker{alloc};
  Scheduler sched{alloc};
  uint64_t now = now_monotonic_us();
  TRY_CTX(from.restore(alloc, broker, sched, now), "reading the " + from.kind() + " state");
  TRY_ASSIGN(StoredState rows, from.load());
  TRY(to.begin());
  auto fail = [&to](Status s) {
    to.rollback();
    return s;
  };
  for (const auto& [id, e] : broker.entitlements())
    if (auto s = to.put_entitlement(id, e); !s.ok()) return fail(s);
  for (MachineId m = 0; m < alloc.machine_count(); ++m)
    if (auto s = to.put_machine(m, broker.persisted(m), alloc.entitlement_of(m)); !s.ok())
      return fail(s);
  for (const auto& j : sched.handover().persisted_jobs())
    if (auto s = to.put_job(j, alloc.request(j.spec.name), alloc.placement(j.spec.name),
                            alloc.dynamic_ports(j.spec.name));
        !s.ok())
      return fail(s);
  for (const auto& [id, t] : sched.tasks())
    if (auto s = to.put_task(t); !s.ok()) return fail(s);
  if (auto s = to.put_task_seq(sched.task_seq()); !s.ok()) return fail(s);
  std::vector<Unavailability> events;
  uint64_t wall = now_realtime_us();
  for (auto& e : rows.events) {
    uint64_t at = static_cast<uint64_t>(e.at_wall_us);
    uint64_t age = at > 0 && wall > at ? wall - at : 0;
    events.push_back({now > age ? now - age : 0, e.machine, e.kind, e.detail});
  }
  if (auto s = to.put_events(events); !s.ok()) return fail(s);
  TRY_ASSIGN(auto maint, from.maintenance());
  for (const auto& m : maint)
    if (auto s = to.put_maintenance(m); !s.ok()) return fail(s);
  TRY_ASSIGN(auto notes, from.notes());
  for (const auto& [key, value] : notes)
    if (auto s = to.put_note(key, value); !s.ok()) return fail(s);
  TRY(to.commit());
  TRY_ASSIGN(auto audit, from.audit(0, StateStore::kMaxAudit));
  for (const auto& a : audit) TRY(to.put_audit(a));
  return {};
}

}  // namespace weft::cp
