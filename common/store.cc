#include "common/store.h"

#include <cerrno>

namespace weft {

// A full disk (SQLITE_FULL) keeps its errno, ENOSPC, so that it reads as what it is and
// callers can tell it apart; the other errors are sqlite's own words.
static Error sqlite_error(sqlite3* db, const std::string& what) {
  if ((sqlite3_extended_errcode(db) & 0xff) == SQLITE_FULL)
    return errno_error(ENOSPC, what + ": " + sqlite3_errmsg(db));
  return make_error(what + ": " + sqlite3_errmsg(db));
}

Stmt::~Stmt() {
  if (!st_) return;
  if (auto cache = cache_.lock()) {
    auto& idle = cache->idle[sql_];
    if (idle.size() < 4) {
      sqlite3_reset(st_);
      sqlite3_clear_bindings(st_);
      idle.push_back(st_);
      return;
    }
  }
  sqlite3_finalize(st_);
}

Stmt& Stmt::bind(int i, int64_t v) {
  sqlite3_bind_int64(st_, i, v);
  return *this;
}
Stmt& Stmt::bind(int i, const std::string& v) {
  sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}
Stmt& Stmt::bind(int i, std::nullptr_t) {
  sqlite3_bind_null(st_, i);
  return *this;
}
Stmt& Stmt::bind_opt(int i, const std::optional<int64_t>& v) {
  return v ? bind(i, *v) : bind(i, nullptr);
}

Result<bool> Stmt::step() {
  int r = sqlite3_step(st_);
  if (r == SQLITE_ROW) return true;
  if (r == SQLITE_DONE) return false;
  return sqlite_error(db_, "sqlite step");
}

Status Stmt::run() {
  for (;;) {
    TRY_ASSIGN(bool row, step());
    if (!row) return {};
  }
}

void Stmt::reset() {
  sqlite3_reset(st_);
  sqlite3_clear_bindings(st_);
}

int64_t Stmt::col_int(int i) const {
  return sqlite3_column_int64(st_, i);
}
std::string Stmt::col_text(int i) const {
  const auto* p = sqlite3_column_text(st_, i);
  return p ? std::string(reinterpret_cast<const char*>(p),
                         static_cast<size_t>(sqlite3_column_bytes(st_, i)))
           : std::string();
}
bool Stmt::col_null(int i) const {
  return sqlite3_column_type(st_, i) == SQLITE_NULL;
}
std::optional<int64_t> Stmt::col_opt_int(int i) const {
  if (col_null(i)) return std::nullopt;
  return col_int(i);
}

Result<std::unique_ptr<Db>> Db::open(const std::string& path, Durability d) {
  sqlite3* raw = nullptr;
  int r =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (r != SQLITE_OK) {
    std::string msg = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    return make_error("open database " + path + ": " + msg);
  }
  std::unique_ptr<Db> db(new Db(raw));
  sqlite3_busy_timeout(raw, 5000);
  TRY_CTX(
      db->exec(d == Durability::kPowerLoss
                   ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;"
                   : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;"),
      "configure database " + path);
  return db;
}

Db::~Db() {
  for (auto& [sql, idle] : cache_->idle)
    for (sqlite3_stmt* st : idle) sqlite3_finalize(st);
  cache_.reset();
  sqlite3_close(db_);
}

Status Db::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    if ((sqlite3_extended_errcode(db_) & 0xff) == SQLITE_FULL)
      return errno_error(ENOSPC, "sqlite: " + msg);
    return make_error("sqlite: " + msg);
  }
  return {};
}

Result<Stmt> Db::prepare(const std::string& sql) {
  if (auto it = cache_->idle.find(sql); it != cache_->idle.end() && !it->second.empty()) {
    sqlite3_stmt* st = it->second.back();
    it->second.pop_back();
    return Stmt(db_, st, cache_, sql);
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v3(db_, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr) !=
      SQLITE_OK) {
    return sqlite_error(db_, "prepare '" + sql.substr(0, 60) + "'");
  }
  return Stmt(db_, st, cache_, sql);
}

Result<int> Db::schema_version() {
  TRY_ASSIGN(Stmt st, prepare("PRAGMA user_version"));
  TRY_ASSIGN(bool row, st.step());
  return row ? static_cast<int>(st.col_int(0)) : 0;
}

Status Db::migrate(const std::vector<std::string>& migrations) {
  TRY_ASSIGN(int version, schema_version());
  if (version > static_cast<int>(migrations.size())) {
    return make_error("database schema version " + std::to_string(version) +
                      " is newer than this program understands (" +
                      std::to_string(migrations.size()) + "); refusing to downgrade");
  }
  for (size_t i = static_cast<size_t>(version); i < migrations.size(); ++i) {
    TRY(begin());
    Status s = exec(migrations[i]);
    if (s.ok()) s = exec("PRAGMA user_version=" + std::to_string(i + 1));
    if (!s.ok()) {
      rollback();
      return std::move(s).error().wrap("schema migration " + std::to_string(i + 1));
    }
    TRY(commit());
  }
  return {};
}

}  // namespace weft
