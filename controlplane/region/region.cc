#include "controlplane/region/region.h"

#include <sys/eventfd.h>

#include <unistd.h>
#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/cp_link.h"
#include "common/log.h"
#include "common/rpc/protocol.h"

namespace weft::cp {

using json = nlohmann::json;

const char* region_role_name(RegionRole r) {
  switch (r) {
    case RegionRole::kShard:
      return "shard";
    case RegionRole::kFrontEnd:
      return "front-end";
    case RegionRole::kBroker:
      return "broker";
    case RegionRole::kAllInOne:
      break;
  }
  return "all-in-one";
}

Status check_shard_id(const std::string& field, const std::string& id) {
  bool ok = !id.empty() && id.size() <= 32 && id[0] != '-';
  for (char ch : id) ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-');
  if (!ok) return field_error(field, "a shard id is 1 to 32 of a-z, 0-9 and '-', not first");
  return {};
}

std::string entitlement_home_key(const std::string& prefix, const std::string& name) {
  return prefix + "entitlements/" + name;
}

std::string entitlement_home_value(const std::string& shard) {
  return json{{"shard", shard}}.dump();
}

namespace {

// A stored record: a JSON object of at most 4 KiB (hostile input).
Result<json> parse_record(const std::string& key, const std::string& value) {
  if (value.size() > 4096) return field_error(key, "record larger than 4 KiB");
  json j = json::parse(value, nullptr, false);
  if (!j.is_object()) return field_error(key, "not a JSON object");
  return j;
}

Error fail_conflict(const std::string& what) {
  return make_error(what).with_code(rpc::kConflict);
}

}  // namespace

Result<std::string> parse_entitlement_home(const std::string& key, const std::string& value) {
  TRY_ASSIGN(json j, parse_record(key, value));
  if (!j.contains("shard") || !j["shard"].is_string())
    return field_error(key, "'shard' must be a shard id");
  std::string shard = j["shard"].get<std::string>();
  TRY(check_shard_id(key + ": shard", shard));
  return shard;
}

Result<std::map<std::string, std::string>> parse_entitlement_homes(
    const std::string& prefix, const std::vector<etcd::Kv>& kvs) {
  std::map<std::string, std::string> out;
  std::string base = prefix + "entitlements/";
  for (const etcd::Kv& kv : kvs) {
    if (kv.key.rfind(base, 0) != 0) return field_error(kv.key, "outside " + base);
    std::string name = kv.key.substr(base.size());
    TRY(check_machine_name(kv.key, name, true));  // an entitlement's name: the same rules
    TRY_ASSIGN(std::string shard, parse_entitlement_home(kv.key, kv.value));
    out[name] = std::move(shard);
  }
  return out;
}

std::string machine_holder_key(const std::string& prefix, const std::string& machine) {
  return prefix + "machines/" + machine;
}

std::string machine_holder_value(const MachineHolder& h) {
  json j{{"holder", h.holder}, {"epoch", h.epoch}};
  if (!h.broker.empty()) j["broker"] = h.broker;
  return j.dump();
}

Result<MachineHolder> parse_machine_holder(const std::string& key, const std::string& value) {
  TRY_ASSIGN(json j, parse_record(key, value));
  MachineHolder h;
  if (!j.contains("holder") || !j["holder"].is_string())
    return field_error(key, "'holder' must be a shard id or \"\"");
  h.holder = j["holder"].get<std::string>();
  if (!h.holder.empty()) TRY(check_shard_id(key + ": holder", h.holder));
  if (!j.contains("epoch") || !j["epoch"].is_number_unsigned())
    return field_error(key, "'epoch' must be a whole number");
  h.epoch = j["epoch"].get<uint64_t>();
  if (j.contains("broker")) {
    if (!j["broker"].is_string()) return field_error(key, "'broker' must be a broker group");
    h.broker = j["broker"].get<std::string>();
    TRY(check_shard_id(key + ": broker", h.broker));
  }
  return h;
}

Status claim_entitlement_home(etcd::Client& c, const std::string& prefix, const std::string& name,
                              const std::string& shard) {
  std::string key = entitlement_home_key(prefix, name);
  etcd::Compare absent{etcd::Compare::Target::kCreate, key, 0, {}};
  etcd::Op put{etcd::Op::Kind::kPut, key, entitlement_home_value(shard), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({absent}, {put}));
  if (r.succeeded) return {};
  TRY_ASSIGN(auto now, c.get(key));
  if (!now) return fail_conflict("entitlement " + name + " changed home meanwhile; try again");
  TRY_ASSIGN(std::string other, parse_entitlement_home(key, now->value));
  return fail_conflict("entitlement " + name + " exists (its shard is " + other + ")");
}

Status drop_entitlement_home(etcd::Client& c, const std::string& prefix, const std::string& name,
                             const std::string& shard) {
  std::string key = entitlement_home_key(prefix, name);
  etcd::Compare mine{etcd::Compare::Target::kValue, key, 0, entitlement_home_value(shard)};
  etcd::Op del{etcd::Op::Kind::kDelete, key, {}, {}, 0};
  TRY(c.txn({mine}, {del}));
  return {};  // not this shard's (any more): nothing to drop
}

std::string move_key(const std::string& prefix, const std::string& name) {
  return prefix + "moves/" + name;
}

std::string move_value(const MoveRecord& m) {
  json j{{"from", m.from},     {"to", m.to},           {"step", m.step},
         {"driver", m.driver}, {"beat_us", m.beat_us}, {"started_us", m.started_us}};
  if (!m.why.empty()) j["why"] = m.why.substr(0, 1024);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<MoveRecord> parse_move(const std::string& key, const std::string& value) {
  TRY_ASSIGN(json j, parse_record(key, value));
  MoveRecord m;
  auto text = [&](const char* k, std::string* out, bool required) -> Status {
    if (!j.contains(k)) {
      if (required) return field_error(key, std::string("'") + k + "' is required");
      return {};
    }
    if (!j[k].is_string()) return field_error(key, std::string("'") + k + "' must be a string");
    *out = j[k].get<std::string>();
    return {};
  };
  TRY(text("from", &m.from, true));
  TRY(text("to", &m.to, true));
  TRY(text("step", &m.step, true));
  TRY(text("driver", &m.driver, false));
  TRY(text("why", &m.why, false));
  TRY(check_shard_id(key + ": from", m.from));
  TRY(check_shard_id(key + ": to", m.to));
  if (m.from == m.to) return field_error(key, "'to' must not be 'from'");
  if (m.step != "export" && m.step != "release" && m.step != "rollback")
    return field_error(key, "'step' must be export, release or rollback");
  for (auto [k, out] : {std::pair{"beat_us", &m.beat_us}, std::pair{"started_us", &m.started_us}}) {
    if (!j.contains(k)) continue;
    if (!j[k].is_number_unsigned())
      return field_error(key, std::string("'") + k + "' must be a time");
    *out = j[k].get<uint64_t>();
  }
  return m;
}

Result<std::map<std::string, MoveRead>> read_moves(etcd::Client& c, const std::string& prefix) {
  std::string base = prefix + "moves/";
  TRY_ASSIGN(auto kvs, c.range_prefix(base));
  std::map<std::string, MoveRead> out;
  for (const auto& kv : kvs) {
    std::string name = kv.key.substr(base.size());
    TRY(check_machine_name(kv.key, name, true));
    TRY_ASSIGN(MoveRecord m, parse_move(kv.key, kv.value));
    out[name] = {std::move(m), kv.value};
  }
  return out;
}

Status begin_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                  const MoveRecord& m) {
  std::string key = move_key(prefix, name);
  std::string home = entitlement_home_key(prefix, name);
  etcd::Compare none{etcd::Compare::Target::kCreate, key, 0, {}};
  etcd::Compare from{etcd::Compare::Target::kValue, home, 0, entitlement_home_value(m.from)};
  etcd::Op put{etcd::Op::Kind::kPut, key, move_value(m), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({none, from}, {put}));
  if (r.succeeded) return {};
  TRY_ASSIGN(auto under_way, c.get(key));
  if (under_way) {
    TRY_ASSIGN(MoveRecord other, parse_move(key, under_way->value));
    return fail_conflict("entitlement " + name + " is moving already, from shard " + other.from +
                         " to " + other.to + " (step " + other.step + ")");
  }
  return fail_conflict("entitlement " + name + " is not on shard " + m.from + " (any more)");
}

Status advance_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                    const std::string& read, const MoveRecord& next) {
  std::string key = move_key(prefix, name);
  std::vector<etcd::Compare> cmp{{etcd::Compare::Target::kValue, key, 0, read}};
  std::vector<etcd::Op> ops{{etcd::Op::Kind::kPut, key, move_value(next), {}, 0}};
  TRY_ASSIGN(MoveRecord before, parse_move(key, read));
  if (next.step == "release" && before.step == "export") {
    std::string home = entitlement_home_key(prefix, name);
    cmp.push_back({etcd::Compare::Target::kValue, home, 0, entitlement_home_value(next.from)});
    ops.push_back({etcd::Op::Kind::kPut, home, entitlement_home_value(next.to), {}, 0});
  }
  TRY_ASSIGN(etcd::TxnResult r, c.txn(cmp, ops));
  if (!r.succeeded)
    return fail_conflict("the move of entitlement " + name +
                         " changed meanwhile (another front end)");
  return {};
}

Status end_move(etcd::Client& c, const std::string& prefix, const std::string& name,
                const std::string& read) {
  std::string key = move_key(prefix, name);
  etcd::Compare same{etcd::Compare::Target::kValue, key, 0, read};
  etcd::Op del{etcd::Op::Kind::kDelete, key, {}, {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({same}, {del}));
  if (!r.succeeded)
    return fail_conflict("the move of entitlement " + name +
                         " changed meanwhile (another front end)");
  return {};
}

Result<MachineHolder> lend_machine(etcd::Client& c, const std::string& prefix,
                                   const std::string& machine, const std::string& shard,
                                   const std::string& broker) {
  std::string key = machine_holder_key(prefix, machine);
  TRY_ASSIGN(auto now, c.get(key));
  MachineHolder next{shard, 1, broker};
  etcd::Compare cmp{etcd::Compare::Target::kCreate, key, 0, {}};
  if (now) {
    TRY_ASSIGN(MachineHolder h, parse_machine_holder(key, now->value));
    if (h.holder == shard) return h;  // already lent to this shard
    if (!h.holder.empty())
      return fail_conflict("machine " + machine + " is held by shard " + h.holder);
    next.epoch = h.epoch + 1;
    cmp = {etcd::Compare::Target::kValue, key, 0, now->value};
  }
  etcd::Op put{etcd::Op::Kind::kPut, key, machine_holder_value(next), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({cmp}, {put}));
  if (!r.succeeded)
    return fail_conflict("machine " + machine + " was taken by another shard meanwhile");
  return next;
}

namespace {

// `machine`'s holder record as stored (its value, and read), if `shard` holds it at
// `epoch`; else kConflict.
Result<std::pair<std::string, MachineHolder>> read_held(etcd::Client& c, const std::string& key,
                                                        const std::string& machine,
                                                        const std::string& shard, uint64_t epoch) {
  TRY_ASSIGN(auto now, c.get(key));
  if (!now) return fail_conflict("machine " + machine + " was never lent");
  TRY_ASSIGN(MachineHolder held, parse_machine_holder(key, now->value));
  if (held.holder != shard || held.epoch != epoch)
    return fail_conflict("machine " + machine + " is not held by shard " + shard + " at epoch " +
                         std::to_string(epoch));
  return std::pair{now->value, held};
}

// Writes `next` if the record is still `read` (the whole value compared: a lend, return or
// transfer meanwhile fails this one, with `conflict`).
Status replace_holder(etcd::Client& c, const std::string& key, const std::string& read,
                      const MachineHolder& next, const std::string& conflict) {
  etcd::Compare cmp{etcd::Compare::Target::kValue, key, 0, read};
  etcd::Op put{etcd::Op::Kind::kPut, key, machine_holder_value(next), {}, 0};
  TRY_ASSIGN(etcd::TxnResult r, c.txn({cmp}, {put}));
  if (!r.succeeded) return fail_conflict(conflict);
  return {};
}

}  // namespace

Result<MachineHolder> transfer_machine(etcd::Client& c, const std::string& prefix,
                                       const std::string& machine, const std::string& from,
                                       uint64_t epoch, const std::string& to) {
  TRY(check_shard_id("to", to));
  if (to == from) return field_error("to", "the machine is held by shard " + from + " already");
  std::string key = machine_holder_key(prefix, machine);
  TRY_ASSIGN(auto held, read_held(c, key, machine, from, epoch));
  MachineHolder next{to, epoch + 1, held.second.broker};
  TRY(replace_holder(c, key, held.first, next,
                     "machine " + machine + " changed holder meanwhile; try again"));
  return next;
}

Result<uint64_t> next_in_sequence(etcd::Client& c, const std::string& key) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    TRY_ASSIGN(auto now, c.get(key));
    uint64_t last = 0;
    etcd::Compare cmp{etcd::Compare::Target::kCreate, key, 0, {}};
    if (now) {
      const std::string& v = now->value;
      if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
        return field_error(key, "is not a sequence number");
      last = std::stoull(v);
      cmp = {etcd::Compare::Target::kValue, key, 0, v};
    }
    etcd::Op put{etcd::Op::Kind::kPut, key, std::to_string(last + 1), {}, 0};
    TRY_ASSIGN(etcd::TxnResult r, c.txn({cmp}, {put}));
    if (r.succeeded) return last + 1;  // else another took it: read again
  }
  return fail_conflict("the sequence " + key + " is contended; try again");
}

Result<MachineHolder> return_machine(etcd::Client& c, const std::string& prefix,
                                     const std::string& machine, const std::string& shard,
                                     uint64_t epoch) {
  std::string key = machine_holder_key(prefix, machine);
  TRY_ASSIGN(auto held, read_held(c, key, machine, shard, epoch));
  MachineHolder free{"", epoch + 1, ""};
  TRY(replace_holder(c, key, held.first, free,
                     "machine " + machine + " is not held by shard " + shard + " at epoch " +
                         std::to_string(epoch)));
  return free;
}

Result<std::unique_ptr<EtcdWorker>> EtcdWorker::create(EventLoop& loop, etcd::Config cfg) {
  std::unique_ptr<EtcdWorker> w(new EtcdWorker());
  TRY_ASSIGN(w->client_, etcd::Client::create(std::move(cfg)));
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return sys_error("eventfd");
  w->efd_ = Fd(fd);
  EtcdWorker* self = w.get();
  TRY_ASSIGN(w->wake_, loop.add_io(fd, EPOLLIN, [self](uint32_t) { self->deliver(); }));
  w->thread_ = std::thread([self] { self->run(); });
  return w;
}

EtcdWorker::~EtcdWorker() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    work_.clear();
  }
  cv_.notify_all();
  client_->cancel_waits();  // a watch under way ends now, not at its timeout
  if (thread_.joinable()) thread_.join();
}

void EtcdWorker::post(Work w) {
  {
    std::lock_guard<std::mutex> g(mu_);
    work_.push_back(std::move(w));
  }
  cv_.notify_all();
}

size_t EtcdWorker::queued() const {
  std::lock_guard<std::mutex> g(mu_);
  return work_.size();
}

void EtcdWorker::run() {
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [this] { return stop_ || !work_.empty(); });
      if (stop_) return;
      w = std::move(work_.front());
      work_.pop_front();
    }
    Then then = w(*client_);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (then) done_.push_back(std::move(then));
    }
    uint64_t one = 1;
    (void)!::write(efd_.get(), &one, sizeof one);
  }
}

void EtcdWorker::deliver() {
  uint64_t n;
  while (::read(efd_.get(), &n, sizeof n) > 0) {
  }
  std::deque<Then> got;
  {
    std::lock_guard<std::mutex> g(mu_);
    got.swap(done_);
  }
  for (auto& then : got) then();
}

Result<std::unique_ptr<PrefixWatch>> PrefixWatch::create(EventLoop& loop, etcd::Config cfg,
                                                         std::string prefix,
                                                         std::function<void()> changed) {
  std::unique_ptr<PrefixWatch> w(new PrefixWatch(loop, std::move(prefix), std::move(changed)));
  TRY_ASSIGN(w->worker_, EtcdWorker::create(loop, std::move(cfg)));
  return w;
}

void PrefixWatch::after(int64_t revision) {
  revision_ = std::max(revision_, revision);
  if (!waiting_) wait();
}

void PrefixWatch::wait() {
  waiting_ = true;
  worker_->post([this, prefix = prefix_, from = revision_](etcd::Client& c) -> EtcdWorker::Then {
    auto r = c.wait_changed(prefix, from, 5'000);
    return [this, r = std::move(r)] {
      waiting_ = false;
      if (!r.ok()) {  // etcd away: again in a second (the reader's own rounds go on)
        auto t = loop_.add_timer_in(1'000'000, [this] {
          if (!waiting_) wait();
        });
        if (t.ok()) retry_ = std::move(t).value();
        return;
      }
      if (*r)
        changed_();  // the reader reads again and says after() with what it saw
      else
        wait();  // nothing within the wait: again, from the same revision
    };
  });
}

}  // namespace weft::cp
