// Small sqlite3 helper: a connection opened in WAL mode, prepared statements with
// typed binds, transactions, and versioned schema migrations.
//
// Migrations are an ordered list of SQL scripts; migration i (0-based) brings the
// schema from version i to i+1, tracked in PRAGMA user_version, each in its own
// transaction. A database newer than the code is refused rather than guessed at.
// Not thread-safe: one Db per thread.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/result.h"

namespace weft {

// Prepared statements a Db keeps for reuse (Db::prepare): compiling a statement costs
// more than running it, on every write of a busy daemon.
struct StmtCache {
  std::unordered_map<std::string, std::vector<sqlite3_stmt*>> idle;
};

class Stmt {
 public:
  Stmt(sqlite3* db, sqlite3_stmt* st) : db_(db), st_(st) {}
  Stmt(sqlite3* db, sqlite3_stmt* st, std::weak_ptr<StmtCache> cache, std::string sql)
      : db_(db), st_(st), cache_(std::move(cache)), sql_(std::move(sql)) {}
  Stmt(Stmt&& o) noexcept
      : db_(o.db_), st_(o.st_), cache_(std::move(o.cache_)), sql_(std::move(o.sql_)) {
    o.st_ = nullptr;
  }
  Stmt(const Stmt&) = delete;
  ~Stmt();

  // Binds by 1-based index.
  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, const std::string& v);
  Stmt& bind(int i, std::nullptr_t);
  Stmt& bind_opt(int i, const std::optional<int64_t>& v);
  // Steps once. true = a row is ready, false = done.
  Result<bool> step();
  // Steps to completion (for statements that return no rows).
  Status run();
  void reset();

  int64_t col_int(int i) const;
  std::string col_text(int i) const;
  bool col_null(int i) const;
  std::optional<int64_t> col_opt_int(int i) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* st_;
  std::weak_ptr<StmtCache> cache_;  // returned there (reset) rather than finalized
  std::string sql_;
};

class Db {
 public:
  // Opens (creating if needed) with journal_mode=WAL and foreign keys on.
  // Durability::kPowerLoss runs synchronous=FULL: a committed transaction survives a
  // power cut (each commit waits for fsync). kProcessCrash runs synchronous=NORMAL:
  // a commit survives the process being killed at any instant, but the last
  // transactions may be lost with the machine's power. Each store says which it needs
  // and why (docs/decisions.md).
  enum class Durability { kPowerLoss, kProcessCrash };
  static Result<std::unique_ptr<Db>> open(const std::string& path,
                                          Durability d = Durability::kPowerLoss);
  ~Db();

  Status exec(const std::string& sql);
  Result<Stmt> prepare(const std::string& sql);
  Status migrate(const std::vector<std::string>& migrations);
  Result<int> schema_version();
  Status begin() { return exec("BEGIN IMMEDIATE"); }
  Status commit() { return exec("COMMIT"); }
  void rollback() { (void)exec("ROLLBACK"); }
  int64_t changes() const { return sqlite3_changes64(db_); }
  sqlite3* raw() const { return db_; }

 private:
  explicit Db(sqlite3* db) : db_(db) {}
  sqlite3* db_;
  std::shared_ptr<StmtCache> cache_ = std::make_shared<StmtCache>();
};

}  // namespace weft
