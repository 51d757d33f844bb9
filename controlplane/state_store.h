// The control plane's durable state in sqlite (WAL): entitlements, machines, jobs with
// their placements, and tasks. The daemon writes what an operation touched inside one
// transaction; after a restart (or SIGKILL) load() and restore() rebuild the allocator,
// broker and scheduler exactly as they were, so nothing is lost and no task restarts.
// Machines come back "unknown" until they report again (their sessions reconnect).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/result.h"
#include "common/store.h"
#include "controlplane/allocator.h"
#include "controlplane/broker.h"
#include "controlplane/maintenance.h"
#include "controlplane/scheduler.h"

namespace weft::cp {

nlohmann::json job_spec_to_json(const JobSpec& s);
// Errors name the field ("count", "per_task.cpu_milli", ...).
Result<JobSpec> job_spec_from_json(const nlohmann::json& j);
// A job row as stored, by this or an older version (whose rows named the entitlement by
// id, and whose rules were looser: such a job is kept as it was, with an error logged).
Result<JobSpec> stored_job_spec(nlohmann::json j,
                                const std::function<std::string(EntitlementId)>& name_of);
nlohmann::json request_to_json(const Request& r);
Result<Request> request_from_json(const nlohmann::json& j);

// One audit log entry: an operator call that changes the cluster, or was refused.
struct AuditRecord {
  int64_t seq = 0;
  int64_t at_wall_us = 0;  // 0 when writing: now
  std::string who;         // certificate subject, or "uid N" on the Unix socket
  std::string role;        // viewer, operator, admin, none
  std::string method;
  std::string target;  // the job, entitlement or machine named
  std::string digest;  // sha256 of the call's parameters as received
  std::string result;  // "ok", "denied: ...", "error: ..."
};

class StateStore {
 public:
  static Result<std::unique_ptr<StateStore>> open(const std::string& path);
  // Clocks in microseconds; tests move them to simulate a reboot or a clock step.
  void set_clocks(std::function<uint64_t()> monotonic, std::function<uint64_t()> wall) {
    mono_ = std::move(monotonic);
    wall_ = std::move(wall);
  }

  // Group commit: open_batch() starts one transaction that the writes after it join,
  // each as a savepoint (begin/commit/rollback below), so a failing write undoes only
  // itself; commit_batch() makes them all durable with one fsync. Without a batch each
  // begin/commit is a transaction of its own.
  Status begin() { return batch_ ? db_->exec("SAVEPOINT w") : db_->begin(); }
  Status commit() { return batch_ ? db_->exec("RELEASE w") : db_->commit(); }
  void rollback() {
    if (!batch_) return db_->rollback();
    (void)db_->exec("ROLLBACK TO w");
    (void)db_->exec("RELEASE w");
  }
  Status open_batch() {
    if (batch_) return {};
    TRY(db_->begin());
    batch_ = true;
    return {};
  }
  Status commit_batch() {
    if (!batch_) return {};
    batch_ = false;
    // sqlite may have rolled the whole transaction back itself (a full disk, an I/O
    // error inside a savepoint): then nothing of the group is there to commit.
    if (sqlite3_get_autocommit(db_->raw()))
      return make_error("sqlite rolled the group's transaction back");
    return db_->commit();
  }
  bool in_batch() const { return batch_; }
  // After a failed commit_batch: nothing of the group stays (rolled back if open).
  void abandon_batch() {
    batch_ = false;
    db_->rollback();
  }

  Status put_entitlement(EntitlementId id, const EntitlementSpec& e);
  Status put_machine(MachineId idx, const Broker::Persisted& m, EntitlementId ent);
  // A job, its spec generation and its placement (allocator request and machines).
  Status put_job(const Scheduler::PersistedJob& j, const std::optional<Request>& req,
                 const std::vector<MachineId>& placement);
  Status delete_job(const std::string& name);  // and its tasks
  // A task's since_us is the scheduler's monotonic time; the row keeps the wall-clock
  // time it stands for, so a restart (or a reboot, which resets the monotonic clock)
  // sees the right age.
  Status put_task(const TaskRecord& t);
  Status delete_tasks(const std::vector<std::string>& ids);  // in one transaction
  Status put_task_seq(uint64_t seq);
  // Unavailability events (their at_us is the monotonic clock, stored as wall-clock
  // time); the table keeps the latest Broker::kMaxEvents.
  Status put_events(const std::vector<Unavailability>& events);

  // Planned maintenance events (written whole; the daemon restores them).
  Status put_maintenance(const MaintenanceEvent& e);
  Status delete_maintenance(uint64_t id);
  Result<std::vector<MaintenanceEvent>> maintenance();

  // Appended in its own transaction; the table keeps the latest kMaxAudit rows.
  static constexpr size_t kMaxAudit = 100'000;
  Status put_audit(const AuditRecord& r);
  // Up to `limit` latest entries at or after `since_wall_us`, oldest first.
  Result<std::vector<AuditRecord>> audit(int64_t since_wall_us, size_t limit);

  // Everything, back into fresh modules (in this order: machines, entitlements,
  // placements, jobs, tasks). The broker must be new: machines get their old ids.
  Status restore(Allocator& alloc, Broker& broker, Scheduler& sched, uint64_t now_us);

 private:
  explicit StateStore(std::unique_ptr<Db> db) : db_(std::move(db)) {}
  bool batch_ = false;
  // A monotonic time of this process as the wall-clock time it stands for (never 0).
  int64_t wall_of(uint64_t mono_us) const;
  // A stored wall-clock time as this boot's monotonic time (`wall_now`, `mono_now`: the
  // clocks now).
  static uint64_t mono_of(uint64_t wall_us, uint64_t wall_now, uint64_t mono_now);
  std::unique_ptr<Db> db_;
  std::function<uint64_t()> mono_ = now_monotonic_us;
  std::function<uint64_t()> wall_ = now_realtime_us;
  uint64_t audit_writes_ = 0;
};

}  // namespace weft::cp
