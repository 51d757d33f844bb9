#include "agent/task_store.h"

#include <algorithm>

#include "common/log.h"

namespace weft::agent {

using json = nlohmann::json;

namespace {

const std::vector<std::string> kMigrations = {
    R"(CREATE TABLE tasks (
         id TEXT PRIMARY KEY,
         name TEXT NOT NULL,
         spec TEXT NOT NULL,
         state TEXT NOT NULL,
         incarnation INTEGER NOT NULL DEFAULT 0,
         pid INTEGER,
         exit_code INTEGER,
         signal INTEGER,
         core_dumped INTEGER NOT NULL DEFAULT 0,
         oom_killed INTEGER NOT NULL DEFAULT 0,
         restarts INTEGER NOT NULL DEFAULT 0,
         reason TEXT NOT NULL DEFAULT '',
         stop_requested INTEGER NOT NULL DEFAULT 0,
         stop_deadline_us INTEGER NOT NULL DEFAULT 0,
         next_start_us INTEGER NOT NULL DEFAULT 0,
         backoff_us INTEGER NOT NULL DEFAULT 0,
         created_us INTEGER NOT NULL,
         started_us INTEGER NOT NULL DEFAULT 0,
         finished_us INTEGER NOT NULL DEFAULT 0,
         warnings TEXT NOT NULL DEFAULT '[]');
       CREATE INDEX tasks_by_name ON tasks(name);)",
    "ALTER TABLE tasks ADD COLUMN own_uid INTEGER NOT NULL DEFAULT -1;",
    "ALTER TABLE tasks ADD COLUMN bridge_addr INTEGER NOT NULL DEFAULT 0;",
};

}  // namespace

Result<std::unique_ptr<TaskStore>> TaskStore::open(const std::string& path,
                                                   std::shared_ptr<const SecretBox> box) {
  // A process crash loses nothing; a power loss may lose the last commits, which
  // recovery reconciles with the cgroup tree (docs/decisions.md).
  TRY_ASSIGN(auto db, Db::open(path, Db::Durability::kProcessCrash));
  TRY_CTX(db->migrate(kMigrations), "agent database");
  return std::unique_ptr<TaskStore>(new TaskStore(std::move(db), std::move(box)));
}

Status TaskStore::save(const TaskRecord& t) {
  TRY_ASSIGN(
      Stmt st,
      db_->prepare(
          "INSERT OR REPLACE INTO tasks (id, name, spec, state, incarnation, pid, exit_code, "
          "signal, "
          "core_dumped, oom_killed, restarts, reason, stop_requested, stop_deadline_us, "
          "next_start_us, "
          "backoff_us, created_us, started_us, finished_us, warnings, own_uid, "
          "bridge_addr) VALUES "
          "(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22)"));
  json spec = to_json(t.spec);
  if (box_) {  // sealed and bound to the task's id (common/secret_box.h)
    json row{{"name", t.id}, {"task", std::move(spec)}};
    spec = std::move(seal_job_secrets(std::move(row), *box_)["task"]);
  }
  st.bind(1, t.id).bind(2, t.name).bind(3, spec.dump()).bind(4, task_state_name(t.state));
  st.bind(5, static_cast<int64_t>(t.incarnation));
  st.bind_opt(6, t.pid > 0 ? std::optional<int64_t>(t.pid) : std::nullopt);
  st.bind_opt(7, t.exit_code ? std::optional<int64_t>(*t.exit_code) : std::nullopt);
  st.bind_opt(8, t.signal ? std::optional<int64_t>(*t.signal) : std::nullopt);
  st.bind(9, int64_t{t.core_dumped}).bind(10, int64_t{t.oom_killed}).bind(11, t.restarts);
  st.bind(12, t.reason).bind(13, int64_t{t.stop_requested}).bind(14, t.stop_deadline_us);
  st.bind(15, t.next_start_us).bind(16, t.backoff_us).bind(17, t.created_us);
  st.bind(18, t.started_us).bind(19, t.finished_us).bind(20, json(t.warnings).dump());
  st.bind(21, static_cast<int64_t>(t.own_uid));
  st.bind(22, static_cast<int64_t>(t.bridge_addr));
  return st.run();
}

Status TaskStore::erase(const std::string& id) {
  TRY_ASSIGN(Stmt st, db_->prepare("DELETE FROM tasks WHERE id = ?1"));
  st.bind(1, id);
  return st.run();
}

Result<std::vector<TaskRecord>> TaskStore::load() {
  std::vector<TaskRecord> out;
  std::vector<std::string> stale;
  TRY_ASSIGN(Stmt st, db_->prepare("SELECT id, name, spec, state, incarnation, pid, exit_code, "
                                   "signal, core_dumped, oom_killed, "
                                   "restarts, reason, stop_requested, stop_deadline_us, "
                                   "next_start_us, backoff_us, created_us, "
                                   "started_us, finished_us, warnings, own_uid, bridge_addr "
                                   "FROM tasks"));
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    TaskRecord rec;
    TaskRecord* t = &rec;
    t->id = st.col_text(0);
    t->name = st.col_text(1);
    json spec = json::parse(st.col_text(2), nullptr, false);
    Result<TaskSpec> parsed = make_error("not opened");
    json stored{{"name", t->id}, {"task", std::move(spec)}};
    if (box_ && !first_secret(stored).empty() && !job_secrets_current(stored, *box_))
      stale.push_back(t->id);  // written in plain text (before sealing), or another key
    auto opened = open_job_secrets(std::move(stored), box_.get());
    if (!opened.ok())
      parsed = make_error("its secrets cannot be opened: " + opened.error().str());
    else
      parsed = parse_task_spec((*opened)["task"]);
    if (!parsed.ok()) {
      log_error("stored task spec no longer parses; the task is kept as failed",
                {{"TASK_ID", t->id}, {"ERROR", parsed.error().str()}});
      t->state = TaskState::kFailed;
      t->reason = "stored spec invalid: " + parsed.error().str();
    } else {
      t->spec = std::move(parsed).value();
      auto state = parse_task_state(st.col_text(3));
      t->state = state.value_or(TaskState::kFailed);
      if (!state) t->reason = "stored state '" + st.col_text(3) + "' unknown";
    }
    t->incarnation = static_cast<uint64_t>(st.col_int(4));
    t->pid = st.col_null(5) ? -1 : static_cast<int>(st.col_int(5));
    if (!st.col_null(6)) t->exit_code = static_cast<int>(st.col_int(6));
    if (!st.col_null(7)) t->signal = static_cast<int>(st.col_int(7));
    t->core_dumped = st.col_int(8) != 0;
    t->oom_killed = st.col_int(9) != 0;
    t->restarts = st.col_int(10);
    if (t->reason.empty()) t->reason = st.col_text(11);
    t->stop_requested = st.col_int(12) != 0;
    t->stop_deadline_us = st.col_int(13);
    t->next_start_us = st.col_int(14);
    t->backoff_us = st.col_int(15);
    t->created_us = st.col_int(16);
    t->started_us = st.col_int(17);
    t->finished_us = st.col_int(18);
    json w = json::parse(st.col_text(19), nullptr, false);
    if (w.is_array())
      for (const auto& x : w)
        if (x.is_string()) t->warnings.push_back(x.get<std::string>());
    t->own_uid = static_cast<long>(st.col_int(20));
    t->bridge_addr = static_cast<uint32_t>(st.col_int(21));
    out.push_back(std::move(rec));
  }
  // Rows from before sealing (or under another key) are written again, sealed now.
  for (const auto& r : out)
    if (std::find(stale.begin(), stale.end(), r.id) != stale.end() && r.reason.rfind("stored", 0))
      TRY_CTX(save(r), "sealing a stored task's secrets");
  return out;
}

}  // namespace weft::agent
