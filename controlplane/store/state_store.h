// The control plane's durable state (sqlite, or etcd for replicas: etcd_store.h): entitlements,
// machines, jobs with their placements, and tasks. The daemon writes what an operation touched
// inside one transaction; after a restart (or SIGKILL) load() and restore() rebuild the allocator,
// broker and scheduler exactly as they were, so nothing is lost and no task restarts.
// Machines come back "unknown" until they report again (their sessions reconnect).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/result.h"
#include "common/secret_box.h"
#include "common/store.h"
#include "controlplane/machines/broker.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/rows.h"

namespace weft::cp {

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

// What a store holds, as read back by load() for restore(): rows in the stored form.
struct StoredState {
  struct Machine {
    MachineId idx = 0;
    std::string machine;
    EntitlementId entitlement = 0;
    nlohmann::json state;
  };
  struct Job {
    nlohmann::json spec;
    uint64_t generation = 0;
    bool stopping = false;
    std::optional<nlohmann::json> request;
    nlohmann::json placement;
  };
  struct Task {
    TaskRecord record;  // since_us unset
    int64_t since_wall_us = 0;
  };
  struct Event {
    int64_t at_wall_us = 0;
    std::string machine, kind, detail;
  };
  std::vector<std::pair<EntitlementId, nlohmann::json>> entitlements;
  std::vector<Machine> machines;
  std::vector<Job> jobs;
  std::vector<Task> tasks;
  std::vector<Event> events;
  std::optional<uint64_t> task_seq;
};

// The seam between the control plane and where its state lives: sqlite on the control
// plane's own disk (one host, the default) or etcd (replicated; several control planes,
// one leading). Both keep the same promise: a write is durable when commit() (or, in a
// group, commit_batch()) returns ok, and nothing of a failed write or group stays.
// The part of a store a group commit drives (controlplane/store/group_commit.h).
class GroupWrites {
 public:
  virtual ~GroupWrites() = default;
  // Group commit: open_batch() starts one transaction that the writes after it join;
  // commit_batch() makes them all durable at once.
  virtual Status open_batch() = 0;
  virtual Status commit_batch() = 0;
  virtual bool in_batch() const = 0;
  // After a failed commit_batch: nothing of the group stays (rolled back if open).
  virtual void abandon_batch() = 0;
  // The group was refused because another control plane leads now (etcd's fence).
  virtual bool fenced_out() const { return false; }
  // Pipelined commits (etcd): commit_batch_async() ends the open group and has it
  // written off the loop's thread; `done` runs on `loop` with the outcome, in the order
  // of the calls. Meanwhile the next group may open. drain() waits for every group sent
  // and runs their `done`s. Stores without them commit here and now.
  virtual bool async_commits() const { return false; }
  virtual void commit_batch_async(EventLoop& loop, std::function<void(Status)> done) {
    (void)loop;
    done(commit_batch());
  }
  virtual void drain() {}
  // A small durable write that means nothing (a full or failing disk refuses it), made
  // before an operator's change is applied, so that a disk that takes no writes refuses
  // the change before memory holds it. Stores that need none (etcd) say yes.
  virtual Status probe_write() { return {}; }
};

class StateStore : public GroupWrites {
 public:
  // The sqlite store at `path` (created on first use).
  static Result<std::unique_ptr<StateStore>> open(const std::string& path);
  // Clocks in microseconds; tests move them to simulate a reboot or a clock step.
  void set_clocks(std::function<uint64_t()> monotonic, std::function<uint64_t()> wall) {
    mono_ = std::move(monotonic);
    wall_ = std::move(wall);
  }
  // Seals the secret values of the job rows it writes and opens those it reads
  // (common/secret_box.h); without a box they are written as they are.
  void set_secrets(std::shared_ptr<const SecretBox> box) { secrets_ = std::move(box); }
  // After restore(): some job row's secrets were not sealed with the current key (written
  // before a key was configured, or under a key rotated out): write every job again.
  bool secrets_stale() const { return secrets_stale_; }
  virtual std::string kind() const = 0;

  // In a group (GroupWrites::open_batch) each begin/commit is a savepoint, so a failing
  // write undoes only itself. Without a group each begin/commit is a transaction of its
  // own; a write outside begin/commit is one too.
  virtual Status begin() = 0;
  virtual Status commit() = 0;
  virtual void rollback() = 0;

  virtual Status put_entitlement(EntitlementId id, const EntitlementSpec& e) = 0;
  virtual Status delete_entitlement(EntitlementId id) = 0;  // entitlement.rm: an empty one
  virtual Status put_machine(MachineId idx, const Broker::Persisted& m, EntitlementId ent) = 0;
  // A job, its spec generation and its placement (allocator request and machines).
  virtual Status put_job(const Scheduler::PersistedJob& j, const std::optional<Request>& req,
                         const std::vector<MachineId>& placement,
                         const std::vector<std::vector<uint16_t>>& dynamic_ports = {}) = 0;
  virtual Status delete_job(const std::string& name) = 0;  // and its tasks
  // A task's since_us is the scheduler's monotonic time; the row keeps the wall-clock
  // time it stands for, so a restart (or a reboot, which resets the monotonic clock)
  // sees the right age.
  virtual Status put_task(const TaskRecord& t) = 0;
  virtual Status delete_tasks(const std::vector<std::string>& ids) = 0;  // in one transaction
  virtual Status put_task_seq(uint64_t seq) = 0;
  // Unavailability events (their at_us is the monotonic clock, stored as wall-clock
  // time); the store keeps the latest UnavailabilityLog::kMaxEvents.
  virtual Status put_events(const std::vector<Unavailability>& events) = 0;

  // Planned maintenance events (written whole; the daemon restores them).
  virtual Status put_maintenance(const MaintenanceEvent& e) = 0;
  virtual Status delete_maintenance(uint64_t id) = 0;
  virtual Result<std::vector<MaintenanceEvent>> maintenance() = 0;

  // The features' notes (notes.h): put whole, erased, read back all at once (a value
  // that is not JSON is left out with a warning: a note never stops a restore).
  virtual Status put_note(const std::string& key, const nlohmann::json& value) = 0;
  virtual Status delete_note(const std::string& key) = 0;
  virtual Result<std::map<std::string, nlohmann::json>> notes() = 0;

  // Appended in its own transaction; the store keeps the latest kMaxAudit entries.
  static constexpr size_t kMaxAudit = 100'000;
  virtual Status put_audit(const AuditRecord& r) = 0;
  // Up to `limit` latest entries at or after `since_wall_us`, oldest first.
  virtual Result<std::vector<AuditRecord>> audit(int64_t since_wall_us, size_t limit) = 0;

  // Everything, as stored.
  virtual Result<StoredState> load() = 0;
  // Everything, back into fresh modules (in this order: machines, entitlements,
  // placements, jobs, tasks). The broker must be new: machines get their old ids.
  Status restore(Allocator& alloc, Broker& broker, Scheduler& sched, uint64_t now_us);
  // restore() of rows already read (`wall_now_us`: the wall clock now).
  static Status apply(StoredState st, Allocator& alloc, Broker& broker, Scheduler& sched,
                      uint64_t now_us, uint64_t wall_now_us);

 private:
  static Status apply_rows(StoredState st, Allocator& alloc, Broker& broker, Scheduler& sched,
                           uint64_t now_us, uint64_t wall_now_us);

 public:
  // An entitlement as the store keeps it (also the document that moves it between a
  // region's shards, move_doc.h).
  static nlohmann::json entitlement_row(const EntitlementSpec& e);

 protected:
  // A monotonic time of this process as the wall-clock time it stands for (never 0).
  int64_t wall_of(uint64_t mono_us) const;
  // A stored wall-clock time as this boot's monotonic time (`wall_now`, `mono_now`: the
  // clocks now).
  static uint64_t mono_of(uint64_t wall_us, uint64_t wall_now, uint64_t mono_now);
  uint64_t wall_now() const { return wall_(); }
  static nlohmann::json machine_row(const Broker::Persisted& m);
  // job_spec_to_json with the secret values sealed (when a box is set).
  // The job's spec, its progress (batch and periodic jobs) within it.
  nlohmann::json job_row_spec(const Scheduler::PersistedJob& j) const;

 private:
  std::shared_ptr<const SecretBox> secrets_;
  bool secrets_stale_ = false;
  std::function<uint64_t()> mono_ = now_monotonic_us;
  std::function<uint64_t()> wall_ = now_realtime_us;
};

// Copies everything `from` holds into `to` (migration from sqlite to etcd): one
// transaction per kind of row; audit entries are copied too.
Status copy_state(StateStore& from, StateStore& to);

}  // namespace weft::cp
