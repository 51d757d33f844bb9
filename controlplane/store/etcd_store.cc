#include "controlplane/store/etcd_store.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "common/log.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/store/notes.h"

#include <iostream>

namespace weft::cp {

using json = nlohmann::json;
using etcd::Op;

namespace {

std::string padded(uint64_t n) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(n));
  return buf;
}

// "<job>.<index>.<seq>": the job is what comes before the last two dots.
std::string job_of_task(const std::string& id) {
  size_t last = id.rfind('.');
  if (last == std::string::npos || last == 0) return {};
  size_t before = id.rfind('.', last - 1);
  return before == std::string::npos ? std::string() : id.substr(0, before);
}

uint64_t seq_after(const std::vector<etcd::Kv>& newest_first, const std::string& prefix) {
  if (newest_first.empty()) return 0;
  const std::string& k = newest_first.front().key;
  return std::strtoull(k.c_str() + std::min(prefix.size(), k.size()), nullptr, 10);
}

}  // namespace

Result<std::unique_ptr<EtcdStore>> EtcdStore::open(EtcdStoreConfig cfg) {
  if (cfg.prefix.empty() || cfg.prefix.back() != '/')
    return field_error("etcd_prefix", "must end with /");
  if (cfg.max_txn_ops < 2) return field_error("etcd_max_txn_ops", "must be at least 2");
  TRY_ASSIGN(auto client, etcd::Client::create(cfg.etcd));
  // Nothing is asked of etcd yet: a replica starts (and follows) while etcd is away.
  return std::unique_ptr<EtcdStore>(new EtcdStore(std::move(cfg), std::move(client)));
}

Status EtcdStore::read_sequences() {
  TRY_ASSIGN(auto ev, client_->last(key("state/events/"), 1));
  event_seq_ = seq_after(ev, key("state/events/"));
  TRY_ASSIGN(auto au, client_->last(key("audit/"), 1));
  audit_seq_ = seq_after(au, key("audit/"));
  return {};
}

Result<bool> EtcdStore::empty() {
  TRY(read_sequences());
  TRY_ASSIGN(auto any, client_->last(key("state/"), 1));
  return any.empty();
}

Status EtcdStore::begin() {
  if (!batch_) {
    ops_.clear();
    tasks_.forget();
  }
  mark_ = ops_.size();
  tasks_.mark();
  open_ = true;
  return {};
}

Status EtcdStore::commit() {
  open_ = false;
  return batch_ ? Status{} : flush();
}

void EtcdStore::rollback() {
  ops_.resize(mark_);
  tasks_.undo();  // the task rows this write changed, as they were
  open_ = false;
}

Status EtcdStore::open_batch() {
  if (batch_) return {};
  ops_.clear();
  batch_ = true;
  return {};
}

Status EtcdStore::commit_batch() {
  if (!batch_) return {};
  batch_ = false;
  return flush();
}

void EtcdStore::abandon_batch() {
  batch_ = false;
  open_ = false;
  ops_.clear();
  tasks_.forget();  // the daemon writes what it holds again
}

Status EtcdStore::add(Op op) {
  ops_.push_back(std::move(op));
  return batch_ || open_ ? Status{} : flush();
}

// ---- pipelined commits

struct EtcdStore::Committer {
  struct Group {
    std::vector<std::vector<Op>> txns;
    std::vector<etcd::Compare> fence;
  };
  struct Outcome {
    Status status;
    bool fenced = false;
  };
  explicit Committer(std::unique_ptr<etcd::Client> c) : client(std::move(c)) {}
  ~Committer() {
    {
      std::lock_guard<std::mutex> g(mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
  void run() {
    for (;;) {
      Group group;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [this] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        group = std::move(queue.front());
        queue.pop_front();
      }
      Outcome out;
      for (const auto& txn : group.txns) {
        auto r = client->txn(group.fence, txn);
        if (!r.ok()) {
          out.status = std::move(r).error();
          break;
        }
        if (!r->succeeded) {
          out.fenced = true;
          out.status = make_error("this control plane no longer leads (its leader key is gone)");
          break;
        }
      }
      {
        std::lock_guard<std::mutex> g(mu);
        outcomes.push_back(std::move(out));
      }
      done_cv.notify_all();
      uint64_t one = 1;
      (void)!::write(efd.get(), &one, sizeof one);
    }
  }

  std::unique_ptr<etcd::Client> client;
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<Group> queue;                        // to send, oldest first
  std::deque<Outcome> outcomes;                   // sent, not yet delivered to the loop
  std::deque<std::function<void(Status)>> dones;  // the loop's: one per group sent
  bool stop = false;
  Fd efd;
  Source wake;
  std::thread thread;
};

Status EtcdStore::flush() {
  // After every group sent ahead of it: etcd applies the writes in the order they were
  // made (a bucket written here must not be overwritten by an older group's value).
  if (committer_) {
    std::unique_lock<std::mutex> g(committer_->mu);
    committer_->done_cv.wait(
        g, [this] { return committer_->outcomes.size() >= committer_->dones.size(); });
  }
  for (const auto& txn : take_transactions()) TRY(send(txn));
  return {};
}

std::vector<std::vector<Op>> EtcdStore::take_transactions() {
  std::vector<std::vector<Op>> out;
  std::vector<Op> ops = std::exchange(ops_, {});
  mark_ = 0;
  tasks_.forget();
  if (ops.empty()) return out;
  // A tasks bucket's value is its rows as they are now (the last write of the group
  // wins anyway); a bucket left empty is deleted.
  // Each bucket is made once, and written once unless a delete came between two of its
  // writes (36 task rows of a job are 36 writes of one bucket: one value, not 36 copies).
  std::map<std::string, std::pair<std::string, size_t>> made;  // value, deletes seen then
  size_t deletes = 0;
  std::vector<Op> kept;
  kept.reserve(ops.size());
  for (auto& op : ops) {
    if (op.kind != Op::Kind::kPut) ++deletes;
    if (op.kind != Op::Kind::kPut || op.value != kLazy) {
      kept.push_back(std::move(op));
      continue;
    }
    auto m = made.find(op.key);
    if (m != made.end() && m->second.second == deletes) continue;  // written already
    if (m == made.end())
      m = made.emplace(op.key,
                       std::pair{tasks_.value(op.key.substr(key("state/tasks/").size())), deletes})
              .first;
    m->second.second = deletes;
    if (m->second.first.empty())
      op.kind = Op::Kind::kDelete;
    else
      op.value = m->second.first;
    kept.push_back(std::move(op));
  }
  ops = std::move(kept);
  // etcd refuses a transaction that names a key twice (a put and a put, or a put inside
  // a deleted range), has more than --max-txn-ops operations or is too large: such a
  // group goes as several transactions, in order. A second put of a key in the same transaction
  // just replaces the first one's value (the same end state).
  std::vector<Op> chunk;
  std::map<std::string, size_t> puts;  // key -> position in chunk
  std::vector<std::pair<std::string, std::string>> deleted;
  size_t limit = cfg_.max_txn_ops - (fence_key_.empty() ? 0 : 1);
  // And at most 1 MiB a transaction: etcd refuses a request larger than its
  // --max-request-bytes (1.5 MiB by default).
  constexpr size_t kMaxTxnBytes = 1u << 20;
  size_t bytes = 0;
  auto in_deleted = [&deleted](const std::string& k) {
    for (const auto& [from, to] : deleted)
      if (k >= from && (to.empty() ? k == from : k < to)) return true;
    return false;
  };
  for (auto& op : ops) {
    bool conflict = false;
    if (op.kind == Op::Kind::kPut) {
      if (auto it = puts.find(op.key); it != puts.end()) {
        chunk[it->second].value = std::move(op.value);
        continue;
      }
      conflict = in_deleted(op.key);
    } else {
      std::string to = op.kind == Op::Kind::kDeleteRange ? op.range_end : std::string();
      for (const auto& [k, pos] : puts)
        if (k >= op.key && (to.empty() ? k == op.key : k < to)) conflict = true;
      if (in_deleted(op.key)) conflict = true;
    }
    size_t op_bytes = op.key.size() + op.value.size() + op.range_end.size() + 16;
    if (!chunk.empty() && (conflict || chunk.size() >= limit || bytes + op_bytes > kMaxTxnBytes)) {
      out.push_back(std::move(chunk));
      chunk.clear();
      puts.clear();
      deleted.clear();
      bytes = 0;
    }
    bytes += op_bytes;
    if (op.kind == Op::Kind::kPut)
      puts[op.key] = chunk.size();
    else
      deleted.emplace_back(op.key, op.kind == Op::Kind::kDeleteRange ? op.range_end : "");
    chunk.push_back(std::move(op));
  }
  if (!chunk.empty()) out.push_back(std::move(chunk));
  return out;
}

std::vector<etcd::Compare> EtcdStore::fence_compare() const {
  std::vector<etcd::Compare> cmp;
  if (!fence_key_.empty())
    cmp.push_back({etcd::Compare::Target::kCreate, fence_key_, fence_rev_, {}});
  return cmp;
}

EtcdStore::EtcdStore(EtcdStoreConfig cfg, std::unique_ptr<etcd::Client> client)
    : cfg_(std::move(cfg)), client_(std::move(client)) {}

EtcdStore::~EtcdStore() = default;

void EtcdStore::commit_batch_async(EventLoop& loop, std::function<void(Status)> done) {
  if (!batch_) return done(Status{});
  batch_ = false;
  if (fenced_out_) {
    ops_.clear();
    tasks_.forget();
    return done(make_error("this control plane no longer leads"));
  }
  if (!committer_) {
    auto client = etcd::Client::create(client_->config());
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!client.ok() || fd < 0) {  // commits here and now, as without a committer
      if (fd >= 0) ::close(fd);
      return done(flush());
    }
    auto c = std::make_unique<Committer>(std::move(client).value());
    c->efd = Fd(fd);
    auto src = loop.add_io(fd, EPOLLIN, [this](uint32_t) { deliver(false); });
    if (!src.ok()) return done(flush());
    c->wake = std::move(src).value();
    c->thread = std::thread([p = c.get()] { p->run(); });
    committer_ = std::move(c);
  }
  Committer::Group group{take_transactions(), fence_compare()};
  committer_->dones.push_back(std::move(done));
  {
    std::lock_guard<std::mutex> g(committer_->mu);
    committer_->queue.push_back(std::move(group));
  }
  committer_->cv.notify_all();
}

void EtcdStore::deliver(bool wait_all) {
  if (!committer_) return;
  uint64_t n;
  while (::read(committer_->efd.get(), &n, sizeof n) > 0) {
  }
  for (;;) {
    std::deque<Committer::Outcome> got;
    {
      std::unique_lock<std::mutex> g(committer_->mu);
      if (wait_all)
        committer_->done_cv.wait(
            g, [this] { return committer_->outcomes.size() >= committer_->dones.size(); });
      got = std::exchange(committer_->outcomes, {});
    }
    for (auto& o : got) {
      if (o.fenced) fenced_out_ = true;
      auto done = std::move(committer_->dones.front());
      committer_->dones.pop_front();
      done(std::move(o.status));
    }
    if (!wait_all || committer_->dones.empty()) return;
  }
}

void EtcdStore::drain() {
  deliver(true);
}

Status EtcdStore::send(const std::vector<Op>& ops) {
  if (ops.empty()) return {};
  if (fenced_out_) return make_error("this control plane no longer leads");
  TRY_ASSIGN(etcd::TxnResult r, client_->txn(fence_compare(), ops));
  if (!r.succeeded) {
    fenced_out_ = true;
    return make_error("this control plane no longer leads (its leader key is gone)");
  }
  return {};
}

Status EtcdStore::put_entitlement(EntitlementId id, const EntitlementSpec& e) {
  return add(
      {Op::Kind::kPut, key("state/entitlements/" + padded(id)), entitlement_row(e).dump(), {}, 0});
}

Status EtcdStore::delete_entitlement(EntitlementId id) {
  return add({Op::Kind::kDelete, key("state/entitlements/" + padded(id)), {}, {}, 0});
}

Status EtcdStore::put_machine(MachineId idx, const Broker::Persisted& m, EntitlementId ent) {
  json row{{"machine", m.info.id}, {"entitlement", ent}, {"state", machine_row(m)}};
  return add({Op::Kind::kPut, key("state/machines/" + padded(idx)), row.dump(), {}, 0});
}

Status EtcdStore::put_job(const Scheduler::PersistedJob& j, const std::optional<Request>& req,
                          const std::vector<MachineId>& placement,
                          const std::vector<std::vector<uint16_t>>& dynamic_ports) {
  json row{{"spec", job_row_spec(j)},
           {"generation", j.generation},
           {"stopping", j.stopping},
           {"request", req ? request_to_json(*req, dynamic_ports) : json()},
           {"placement", placement}};
  return add({Op::Kind::kPut, key("state/jobs/" + j.spec.name), row.dump(), {}, 0});
}

Status EtcdStore::delete_job(const std::string& name) {
  tasks_.erase_job(name);
  TRY(add({Op::Kind::kDelete, key("state/jobs/" + name), {}, {}, 0}));
  std::string tasks = key("state/tasks/" + name + "/");
  return add({Op::Kind::kDeleteRange, tasks, {}, etcd::prefix_end(tasks), 0});
}

Status EtcdStore::put_task(const TaskRecord& t) {
  // The row written straight, without a JSON document per task (the hot path of a job's
  // creation: 36 rows a job); the same object the restore reads.
  std::string row;
  row.reserve(160 + t.message.size());
  row += "{\"index\":";
  row += std::to_string(t.index);
  row += ",\"generation\":";
  row += std::to_string(t.generation);
  row += ",\"machine\":";
  row += std::to_string(t.machine);
  row += ",\"state\":\"";
  row += task_state_name(t.state);
  row += "\",\"since_wall_us\":";
  row += std::to_string(wall_of(t.since_us));
  row += ",\"message\":";
  row += t.message.empty() ? std::string("\"\"")
                           : json(t.message).dump(-1, ' ', false, json::error_handler_t::replace);
  row += ",\"held\":";
  row += t.held ? "true" : "false";
  if (t.preempted) row += ",\"preempted\":true";
  if (!t.ports.empty()) {
    row += ",\"ports\":";
    row += task_ports_json(t.ports).dump();
  }
  row += '}';
  int bucket = t.index / TaskBuckets::kTasksPerKey;
  tasks_.set(t.job, bucket, t.id, std::move(row));
  // The bucket's value is made when the group is sent (flush), from the rows then.
  return add({Op::Kind::kPut, key(TaskBuckets::key(t.job, bucket)), std::string(kLazy), {}, 0});
}

Status EtcdStore::delete_tasks(const std::vector<std::string>& ids) {
  TRY(begin());
  for (const auto& id : ids) {
    std::string job = job_of_task(id);
    std::optional<int> bucket = job.empty() ? std::nullopt : tasks_.bucket_of(job, id);
    if (!bucket) continue;
    tasks_.set(job, *bucket, id, std::nullopt);
    (void)add({Op::Kind::kPut, key(TaskBuckets::key(job, *bucket)), std::string(kLazy), {}, 0});
  }
  return commit();
}

Status EtcdStore::put_task_seq(uint64_t seq) {
  return add({Op::Kind::kPut, key("state/meta/task_seq"), std::to_string(seq), {}, 0});
}

Status EtcdStore::put_events(const std::vector<Unavailability>& events) {
  if (events.empty()) return {};
  for (const auto& e : events) {
    json row{{"at_wall_us", wall_of(e.at_us)},
             {"machine", e.machine},
             {"kind", e.kind},
             {"detail", e.detail}};
    TRY(add({Op::Kind::kPut, key("state/events/" + padded(++event_seq_)), row.dump(), {}, 0}));
  }
  if (event_seq_ <= UnavailabilityLog::kMaxEvents) return {};
  return add({Op::Kind::kDeleteRange,
              key("state/events/"),
              {},
              key("state/events/" + padded(event_seq_ - UnavailabilityLog::kMaxEvents + 1)),
              0});
}

Status EtcdStore::put_maintenance(const MaintenanceEvent& e) {
  return add({Op::Kind::kPut, key("state/maintenance/" + padded(e.id)), to_json(e).dump(), {}, 0});
}

Status EtcdStore::delete_maintenance(uint64_t id) {
  return add({Op::Kind::kDelete, key("state/maintenance/" + padded(id)), {}, {}, 0});
}

Result<std::vector<MaintenanceEvent>> EtcdStore::maintenance() {
  TRY_ASSIGN(auto kvs, client_->range_prefix(key("state/maintenance/")));
  std::vector<MaintenanceEvent> out;
  for (const auto& kv : kvs) {
    auto e = maintenance_from_json(json::parse(kv.value, nullptr, false));
    if (!e.ok()) return std::move(e).error().wrap(kv.key);
    out.push_back(std::move(e).value());
  }
  return out;
}

// The notes live beside state/ (notes/<key>), not in it: load() reads every row of
// state/, and a restore reads the notes once, on their own.
Status EtcdStore::put_note(const std::string& k, const json& value) {
  return add({Op::Kind::kPut,
              key("notes/" + k),
              value.dump(-1, ' ', false, json::error_handler_t::replace),
              {},
              0});
}

Status EtcdStore::delete_note(const std::string& k) {
  return add({Op::Kind::kDelete, key("notes/" + k), {}, {}, 0});
}

Result<std::map<std::string, json>> EtcdStore::notes() {
  const std::string base = key("notes/");
  TRY_ASSIGN(auto kvs, client_->range_prefix(base));
  std::map<std::string, json> out;
  for (auto& kv : kvs) {
    std::string k = kv.key.substr(base.size());
    json v = json::parse(kv.value, nullptr, false);
    if (v.is_discarded() || !Notes::valid_key(k)) {
      log_warn("a stored note is not readable: left out", {{"KEY", kv.key}});
      continue;
    }
    out.emplace(std::move(k), std::move(v));
  }
  return out;
}

Status EtcdStore::put_audit(const AuditRecord& r) {
  json row{{"at_wall_us", r.at_wall_us ? r.at_wall_us : static_cast<int64_t>(wall_now())},
           {"who", r.who},
           {"role", r.role},
           {"method", r.method},
           {"target", r.target},
           {"digest", r.digest},
           {"result", r.result}};
  uint64_t seq = ++audit_seq_;
  TRY(add({Op::Kind::kPut, key("audit/" + padded(seq)), row.dump(), {}, 0}));
  if (seq % 1000 == 0 && seq > kMaxAudit)
    return add(
        {Op::Kind::kDeleteRange, key("audit/"), {}, key("audit/" + padded(seq - kMaxAudit)), 0});
  return {};
}

Result<std::vector<AuditRecord>> EtcdStore::audit(int64_t since_wall_us, size_t limit) {
  TRY_ASSIGN(auto kvs, client_->last(key("audit/"), limit));
  std::vector<AuditRecord> out;
  std::string prefix = key("audit/");
  for (auto it = kvs.rbegin(); it != kvs.rend(); ++it) {
    json j = json::parse(it->value, nullptr, false);
    if (!j.is_object()) return make_error("corrupt audit entry " + it->key);
    AuditRecord r;
    r.seq = std::strtoll(it->key.c_str() + std::min(prefix.size(), it->key.size()), nullptr, 10);
    r.at_wall_us = j.value("at_wall_us", int64_t{0});
    if (r.at_wall_us < since_wall_us) continue;
    r.who = j.value("who", "");
    r.role = j.value("role", "");
    r.method = j.value("method", "");
    r.target = j.value("target", "");
    r.digest = j.value("digest", "");
    r.result = j.value("result", "");
    out.push_back(std::move(r));
  }
  return out;
}

Result<StoredState> EtcdStore::load() {
  TRY(read_sequences());
  TRY_ASSIGN(auto kvs, client_->range_prefix(key("state/")));
  StoredState st;
  TaskBuckets::Rows rows;
  TRY(parse_etcd_rows(kvs, key("state/"), &st, &rows));
  tasks_.load(rows);
  return st;
}

Status parse_etcd_rows(const std::vector<etcd::Kv>& kvs, const std::string& base, StoredState* st,
                       TaskBuckets::Rows* tasks) {
  auto number = [](const std::string& s) -> Result<uint64_t> {
    if (s.empty() || s.size() > 20 || (s.size() == 20 && s > "18446744073709551615") ||
        !std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= '0' && c <= '9'; }))
      return make_error("bad number \"" + s + "\"");
    return std::strtoull(s.c_str(), nullptr, 10);
  };
  // Integers only where the rows hold integers: a float (or a string) there is corrupt,
  // and converting it would be undefined.
  auto integers = [](const json& j, std::initializer_list<const char*> names) {
    for (const char* n : names) {
      auto it = j.find(n);
      if (it != j.end() && !it->is_number_integer())
        throw std::runtime_error(std::string("'") + n + "' is not an integer");
    }
  };
  for (auto& kv : kvs) {
    if (kv.key.size() < base.size() || kv.key.compare(0, base.size(), base) != 0) continue;
    std::string rest = kv.key.substr(base.size());
    size_t slash = rest.find('/');
    std::string table = rest.substr(0, slash),
                id = slash == std::string::npos ? std::string() : rest.substr(slash + 1);
    json j = json::parse(kv.value, nullptr, false);
    auto corrupt = [&kv](const std::string& why) {
      return make_error("corrupt etcd key " + kv.key + ": " + why);
    };
    try {
      if (table == "entitlements") {
        TRY_ASSIGN(uint64_t n, number(id));
        if (!j.is_object()) return corrupt("not an object");
        integers(j, {"quota"});
        st->entitlements.emplace_back(static_cast<EntitlementId>(n), std::move(j));
      } else if (table == "machines") {
        TRY_ASSIGN(uint64_t n, number(id));
        if (!j.is_object() || !j.contains("state") || !j["state"].is_object())
          return corrupt("not a machine");
        integers(j, {"entitlement"});
        integers(j["state"], {"cpu_milli", "mem_mb"});
        st->machines.push_back({static_cast<MachineId>(n), j.at("machine").get<std::string>(),
                                j.at("entitlement").get<EntitlementId>(), j.at("state")});
      } else if (table == "jobs") {
        if (!j.is_object()) return corrupt("not an object");
        integers(j, {"generation"});
        StoredState::Job row;
        row.spec = j.at("spec");
        row.generation = j.at("generation").get<uint64_t>();
        row.stopping = j.at("stopping").get<bool>();
        if (!j.at("request").is_null()) {
          if (!j["request"].is_object()) return corrupt("the placement request is not an object");
          integers(j["request"], {"generation", "entitlement", "tasks", "cpu_milli", "mem_mb"});
          row.request = j.at("request");
        }
        row.placement = j.at("placement");
        st->jobs.push_back(std::move(row));
      } else if (table == "tasks") {
        size_t s2 = id.rfind('/');
        if (s2 == std::string::npos || !j.is_object()) return corrupt("not a tasks bucket");
        std::string job = id.substr(0, s2);
        int bucket = std::atoi(id.c_str() + s2 + 1);
        for (auto& [tid, row] : j.items()) {
          if (!row.is_object()) return corrupt("a task row is not an object");
          integers(row, {"index", "generation", "machine", "since_wall_us"});
          StoredState::Task t;
          t.record.job = job;
          t.record.id = tid;
          t.record.index = row.at("index").get<int>();
          t.record.generation = row.at("generation").get<uint64_t>();
          t.record.machine = row.at("machine").get<MachineId>();
          t.record.state =
              parse_task_state(row.at("state").get<std::string>()).value_or(TaskState::kLost);
          t.since_wall_us = row.at("since_wall_us").get<int64_t>();
          t.record.message = row.at("message").get<std::string>();
          t.record.held = row.at("held").get<bool>();
          if (row.contains("ports")) t.record.ports = task_ports_from(row["ports"]);
          if (auto p = row.find("preempted"); p != row.end()) t.record.preempted = p->get<bool>();
          (*tasks)[job][bucket][tid] = row;
          st->tasks.push_back(std::move(t));
        }
      } else if (table == "meta") {
        if (id == "task_seq") {
          TRY_ASSIGN(uint64_t n, number(kv.value));
          st->task_seq = n;
        }
      } else if (table == "events") {
        if (!j.is_object()) return corrupt("not an object");
        integers(j, {"at_wall_us"});
        st->events.push_back({j.at("at_wall_us").get<int64_t>(), j.at("machine").get<std::string>(),
                              j.at("kind").get<std::string>(), j.at("detail").get<std::string>()});
      }
      // state/maintenance/ is read by maintenance(); other keys belong to a newer version.
    } catch (const std::exception& e) {
      return corrupt(e.what());
    }
  }
  return {};
}

int migrate_to_etcd(const CpConfig& cfg, const std::string& sqlite_path) {
  auto fail = [](const std::string& why) {
    std::cerr << "weft-controlplane migrate: " << why << "\n";
    return 1;
  };
  if (cfg.store.kind != "etcd")
    return fail("the configuration's [store] kind is not \"etcd\": nothing to migrate to");
  if (!path_exists(sqlite_path)) return fail(sqlite_path + ": no such database");
  auto from = StateStore::open(sqlite_path);
  if (!from.ok()) return fail(from.error().str());
  auto to = EtcdStore::open(cfg.store.etcd);
  if (!to.ok()) return fail(to.error().str());
  auto empty = (*to)->empty();
  if (!empty.ok()) return fail(empty.error().str());
  if (!*empty)
    return fail("etcd already holds a control-plane state under " + cfg.store.etcd.prefix +
                ": refusing to mix two states (use another etcd_prefix, or delete that one)");
  auto client = etcd::Client::create(cfg.store.etcd.etcd);
  if (!client.ok()) return fail(client.error().str());
  auto leader = (*client)->get(cfg.store.etcd.prefix + "leader");
  if (!leader.ok()) return fail(leader.error().str());
  if (*leader)
    return fail("a control plane replica leads (" + (*leader)->value +
                "): stop every replica before migrating");
  if (auto s = copy_state(**from, **to); !s.ok()) return fail(s.error().str());
  auto rows = (*to)->load();
  if (!rows.ok()) return fail("copied, but cannot read it back: " + rows.error().str());
  std::cout << "copied " << sqlite_path << " into etcd under " << cfg.store.etcd.prefix << ": "
            << rows->entitlements.size() << " entitlements, " << rows->machines.size()
            << " machines, " << rows->jobs.size() << " jobs, " << rows->tasks.size() << " tasks, "
            << rows->events.size() << " events\n";
  return 0;
}

}  // namespace weft::cp
