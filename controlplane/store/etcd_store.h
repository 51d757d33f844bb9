// The control plane's state in etcd, for replicated control planes (docs/replicas.md).
//
// Each row is one key under `prefix` ("/weft/" by default), its value JSON:
//   state/entitlements/<id>, state/machines/<idx>, state/jobs/<name>,
//   state/tasks/<job>/<bucket>, state/meta/task_seq, state/events/<seq>,
//   state/maintenance/<id>, audit/<seq>  (numbers zero-padded: key order is number order),
//   notes/<key> (the features' notes, controlplane/store/notes.h)
// and `leader`, the election key (controlplane/store/leader.h). A job's tasks are kept 64
// indexes to a key (a bucket: {task id: row}): a 36-task job starting is one put, not 36
// (etcd's cost is per key: docs/benchmarks.md). The store keeps the rows it wrote
// (controlplane/store/task_buckets.h), to make a bucket's value.
//
// Writes are buffered and sent as etcd transactions: one per write outside a group, one
// per group at commit_batch() (split, in order, when a group is larger than etcd's
// --max-txn-ops or would touch a key twice). commit_batch_async() hands a group's
// transactions to a committer thread, which sends them in order while the loop works
// on the next group; the outcome comes back to the loop through an eventfd. Every transaction
// carries the fence, once set: "the leader key still has the create revision it had when this
// process won". A deposed leader's transaction therefore changes nothing, and fenced_out() turns
// true: the daemon must stop (it cannot tell what its memory holds that etcd does not).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "controlplane/store/etcd_client.h"
#include "controlplane/store/state_store.h"
#include "controlplane/store/task_buckets.h"

namespace weft::cp {

struct EtcdStoreConfig {
  etcd::Config etcd;
  std::string prefix = "/weft/";
  size_t max_txn_ops = 128;  // etcd's --max-txn-ops (128 by default)
};

class EtcdStore final : public StateStore {
 public:
  static Result<std::unique_ptr<EtcdStore>> open(EtcdStoreConfig cfg);

  // From now on every transaction requires `key` to exist with this create revision.
  void fence(std::string key, int64_t create_revision) {
    fence_key_ = std::move(key);
    fence_rev_ = create_revision;
  }
  bool fenced_out() const override { return fenced_out_; }
  // Where the event and audit sequences stand (load() and empty() read them; writes
  // before either would start them at 0).
  Status read_sequences();
  // True when nothing is stored under the prefix's state/ (a fresh cluster).
  Result<bool> empty();

  std::string kind() const override { return "etcd"; }
  Status begin() override;
  Status commit() override;
  void rollback() override;
  Status open_batch() override;
  Status commit_batch() override;
  bool in_batch() const override { return batch_; }
  void abandon_batch() override;
  bool async_commits() const override { return true; }
  void commit_batch_async(EventLoop& loop, std::function<void(Status)> done) override;
  void drain() override;
  ~EtcdStore() override;

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
  Status put_events(const std::vector<Unavailability>& events) override;
  Status put_maintenance(const MaintenanceEvent& e) override;
  Status delete_maintenance(uint64_t id) override;
  Result<std::vector<MaintenanceEvent>> maintenance() override;
  Status put_note(const std::string& key, const nlohmann::json& value) override;
  Status delete_note(const std::string& key) override;
  Result<std::map<std::string, nlohmann::json>> notes() override;
  Status put_audit(const AuditRecord& r) override;
  Result<std::vector<AuditRecord>> audit(int64_t since_wall_us, size_t limit) override;
  Result<StoredState> load() override;

 private:
  EtcdStore(EtcdStoreConfig cfg, std::unique_ptr<etcd::Client> client);
  std::string key(const std::string& rest) const { return cfg_.prefix + rest; }
  Status add(etcd::Op op);
  Status flush();
  // The buffered writes as etcd transactions, in order (bucket values made, split where
  // a key repeats or the group is larger than --max-txn-ops); the buffer is emptied.
  std::vector<std::vector<etcd::Op>> take_transactions();
  std::vector<etcd::Compare> fence_compare() const;
  Status send(const std::vector<etcd::Op>& ops);
  // The thread that writes pipelined groups (commit_batch_async), with a client of its
  // own (the loop's reads keep client_).
  struct Committer;
  std::unique_ptr<Committer> committer_;
  void deliver(bool wait_all);

  static constexpr const char* kLazy = "\x01bucket";  // value made at flush()
  // The task rows written, by job and bucket, with the undo log of the open write.
  TaskBuckets tasks_;

  EtcdStoreConfig cfg_;
  std::unique_ptr<etcd::Client> client_;
  std::vector<etcd::Op> ops_;
  size_t mark_ = 0;
  bool batch_ = false, open_ = false;
  std::string fence_key_;
  int64_t fence_rev_ = 0;
  bool fenced_out_ = false;
  uint64_t event_seq_ = 0, audit_seq_ = 0;
};

// The rows of a range of keys under `base` ("<prefix>state/"): hostile input (a corrupt
// or forged etcd), refused with the key named rather than trusted; a job's task rows by
// bucket into `tasks`.
Status parse_etcd_rows(const std::vector<etcd::Kv>& kvs, const std::string& base, StoredState* st,
                       TaskBuckets::Rows* tasks);

// weft-controlplane migrate: the sqlite state at `sqlite_path` copied into the etcd store
// `cfg` names. Refused when cfg's store is not etcd, when the prefix holds state already
// or a replica leads (stop them all first). Prints what it copied; the exit code.
struct CpConfig;
int migrate_to_etcd(const CpConfig& cfg, const std::string& sqlite_path);

}  // namespace weft::cp
