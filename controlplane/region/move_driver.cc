#include "controlplane/region/move_driver.h"

#include <cstdlib>

#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "common/strings.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/records.h"
#include "controlplane/region/transactions.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {

// Tests only: the driver stops after this step is done (as if its front end died there),
// so that a test can kill a party at each step ("out", "in", "decided", "open").
std::string hold_after() {
  const char* v = std::getenv("WEFT_TEST_MOVE_HOLD_AFTER");
  return v ? v : "";
}

json record_json(const MoveRecord& m) {
  json j{{"from", m.from}, {"to", m.to}, {"step", m.step}, {"driver", m.driver}};
  if (m.started_us) j["started_wall_us"] = m.started_us;
  if (m.beat_us) j["beat_wall_us"] = m.beat_us;
  if (!m.why.empty()) j["why"] = m.why;
  return j;
}

}  // namespace

Result<std::unique_ptr<MoveDriver>> MoveDriver::create(EventLoop& loop, const CpConfig& cfg,
                                                       Hooks hooks) {
  std::unique_ptr<MoveDriver> d(new MoveDriver(loop, cfg, std::move(hooks)));
  TRY_ASSIGN(d->etcd_, EtcdWorker::create(loop, cfg.store.etcd.etcd));
  TRY_ASSIGN(d->round_timer_, loop.add_timer_in(1'000'000, [p = d.get()] { p->round(); }));
  return d;
}

MoveDriver::MoveDriver(EventLoop& loop, const CpConfig& cfg, Hooks hooks)
    : loop_(loop), prefix_(cfg.region.prefix), hooks_(std::move(hooks)) {
  me_ = "fe-" + random_hex(6);
  if (const char* v = std::getenv("WEFT_TEST_MOVE_DECIDE_MS"))
    decide_us_ = std::strtoull(v, nullptr, 10) * 1000;
}

bool MoveDriver::retryable(const Error& e) const {
  return e.code == rpc::kUnavailable || e.code == rpc::kTimeout || e.code == rpc::kNotLeader ||
         e.code == 0 || e.code == rpc::kInternalError;
}

void MoveDriver::start(const std::string& name, const std::string& from, const std::string& to,
                       bool wait, Done done) {
  if (drives_.count(name))
    return done(make_error("entitlement " + name + " is moving already").with_code(rpc::kConflict));
  MoveRecord m;
  m.from = from;
  m.to = to;
  m.step = "export";
  m.driver = me_;
  m.started_us = m.beat_us = now_realtime_us();
  std::string prefix = prefix_;
  etcd_->post([this, prefix, name, m, wait, done](etcd::Client& c) -> EtcdWorker::Then {
    Status s = begin_move(c, prefix, name, m);
    return [this, s, name, m, wait, done] {
      if (!s.ok()) return done(s.error());
      if (drives_.count(name))
        return done(
            make_error("entitlement " + name + " is moving already").with_code(rpc::kConflict));
      log_info("entitlement move begun", {{"ENTITLEMENT", name}, {"FROM", m.from}, {"TO", m.to}});
      Drive& d = drives_[name];
      d.read = {m, move_value(m)};
      if (wait)
        d.waiting.push_back(done);
      else
        done(json{{"entitlement", name}, {"move", record_json(m)}});
      step(name);
    };
  });
}

void MoveDriver::list(std::function<void(Result<std::map<std::string, json>>)> done) {
  std::string prefix = prefix_;
  etcd_->post([prefix, done](etcd::Client& c) -> EtcdWorker::Then {
    auto moves = read_moves(c, prefix);
    return [moves, done] {
      if (!moves.ok()) return done(moves.error());
      std::map<std::string, json> out;
      for (const auto& [name, r] : *moves) out[name] = record_json(r.record);
      done(out);
    };
  });
}

void MoveDriver::after(const std::string& name, uint64_t us) {
  auto t = loop_.add_timer_in(us, [this, name] {
    timers_.erase(name);
    if (drives_.count(name)) step(name);
  });
  if (t.ok()) timers_[name] = std::move(t).value();
}

void MoveDriver::write(const std::string& name, MoveRecord next, std::function<void(Status)> then) {
  auto it = drives_.find(name);
  if (it == drives_.end()) return;
  next.driver = me_;
  next.beat_us = now_realtime_us();
  std::string prefix = prefix_, read = it->second.read.value;
  bool end = next.step == "done";
  etcd_->post([prefix, name, read, next, end, then, this](etcd::Client& c) -> EtcdWorker::Then {
    Status s = end ? end_move(c, prefix, name, read) : advance_move(c, prefix, name, read, next);
    return [this, s, name, next, end, then] {
      auto d = drives_.find(name);
      if (d == drives_.end()) return;
      if (s.ok() && !end) d->second.read = {next, move_value(next)};
      if (!s.ok() && s.error().code == rpc::kConflict) {
        // Another front end drives it now (it thought this one dead): it finishes it.
        log_warn("a move is driven by another front end now",
                 {{"ENTITLEMENT", name}, {"ERROR", s.error().str()}});
        for (auto& w : d->second.waiting)
          w(make_error("the move of " + name +
                       " is carried on by another front end: weftctl entitlement show " + name)
                .with_code(rpc::kUnavailable));
        drives_.erase(d);
        return;
      }
      then(s);
    };
  });
}

void MoveDriver::failed(const std::string& name, const Error& e, const char* what) {
  auto d = drives_.find(name);
  if (d == drives_.end()) return;
  const MoveRecord& r = d->second.read.record;
  bool decided = r.step != "export";
  if (!decided && (!retryable(e) || now_realtime_us() > r.started_us + decide_us_))
    return rollback(name, std::string(what) + ": " + e.str());
  log_warn("a move's step is asked again",
           {{"ENTITLEMENT", name}, {"STEP", what}, {"ERROR", e.str()}});
  // Beat while waiting, so that no other front end takes it over.
  MoveRecord same = r;
  write(name, same, [this, name](Status) { after(name, 1'000'000); });
}

void MoveDriver::step(const std::string& name) {
  auto it = drives_.find(name);
  if (it == drives_.end()) return;
  const MoveRecord rec = it->second.read.record;
  if (rec.step == "export")
    export_step(name, rec);
  else if (rec.step == "release")
    release_step(name, rec);
  else
    rollback_step(name, rec);
}

void MoveDriver::export_step(const std::string& name, const MoveRecord& rec) {
  json out{{"step", "out"}, {"entitlement", name}, {"to", rec.to}};
  uint64_t asked = now_monotonic_us();
  hooks_.call(rec.from, out, [this, name, rec, asked](Result<json> r) {
    auto d = drives_.find(name);
    if (d == drives_.end()) return;
    if (!r.ok()) return failed(name, r.error(), "fencing it on the old shard");
    d->second.fenced_at_us = asked;
    d->second.counts = {{"machines", r->value("machines", 0)},
                        {"jobs", r->value("jobs", 0)},
                        {"tasks", r->value("tasks", 0)},
                        {"document_bytes", r->value("bytes", 0)}};
    if (hold_after() == "out") return;
    auto pages = std::make_shared<std::vector<std::string>>();
    pages->push_back(r->value("data", ""));
    copy_pages(name, rec, pages, r->value("pages", size_t{1}));
  });
}

// The document's pages from the old shard (the first came with `out`), then to the new
// one in order: each page a call, as a session's line is at most 1 MiB.
void MoveDriver::copy_pages(const std::string& name, const MoveRecord& rec,
                            std::shared_ptr<std::vector<std::string>> pages, size_t total) {
  if (!drives_.count(name)) return;
  if (pages->size() >= total) return send_pages(name, rec, pages, 0);
  json ask{{"step", "page"}, {"entitlement", name}, {"page", pages->size()}};
  hooks_.call(rec.from, ask, [this, name, rec, pages, total](Result<json> p) {
    if (!drives_.count(name)) return;
    if (!p.ok()) return failed(name, p.error(), "reading its pages from the old shard");
    pages->push_back(p->value("data", ""));
    copy_pages(name, rec, pages, total);
  });
}

void MoveDriver::send_pages(const std::string& name, const MoveRecord& rec,
                            std::shared_ptr<std::vector<std::string>> pages, size_t next) {
  json in{{"step", "in"},           {"entitlement", name}, {"from", rec.from},
          {"pages", pages->size()}, {"page", next},        {"data", (*pages)[next]}};
  hooks_.call(rec.to, in, [this, name, rec, pages, next](Result<json> r) {
    if (!drives_.count(name)) return;
    if (!r.ok()) return failed(name, r.error(), "reading it in on the new shard");
    if (next + 1 < pages->size()) return send_pages(name, rec, pages, next + 1);
    if (hold_after() == "in") return;
    MoveRecord decided = rec;
    decided.step = "release";
    write(name, decided, [this, name](Status s) {
      if (!s.ok()) return failed(name, s.error(), "moving its home in etcd");
      log_info("entitlement move decided: its home is the new shard", {{"ENTITLEMENT", name}});
      hooks_.homes_changed();
      if (hold_after() == "decided") return;
      step(name);
    });
  });
}

void MoveDriver::release_step(const std::string& name, const MoveRecord& rec) {
  json open{{"step", "open"}, {"entitlement", name}};
  hooks_.call(rec.to, open, [this, name, rec](Result<json> r) {
    auto d = drives_.find(name);
    if (d == drives_.end()) return;
    if (!r.ok()) return failed(name, r.error(), "opening it on the new shard");
    if (d->second.fenced_at_us && !d->second.fenced_us)
      d->second.fenced_us = now_monotonic_us() - d->second.fenced_at_us;
    if (hold_after() == "open") return;
    json forget{{"step", "forget"}, {"entitlement", name}, {"to", rec.to}};
    hooks_.call(rec.from, forget, [this, name, rec](Result<json> r2) {
      if (!drives_.count(name)) return;
      if (!r2.ok()) return failed(name, r2.error(), "forgetting it on the old shard");
      MoveRecord done = rec;
      done.step = "done";
      write(name, done, [this, name, rec](Status s) {
        if (!s.ok()) return failed(name, s.error(), "ending the move in etcd");
        Drive& drive = drives_[name];
        json out{{"entitlement", name}, {"from", rec.from}, {"to", rec.to}, {"moved", true}};
        out.update(drive.counts);
        if (drive.fenced_us) out["fenced_ms"] = drive.fenced_us / 1000;
        log_info("entitlement moved", {{"ENTITLEMENT", name},
                                       {"FROM", rec.from},
                                       {"TO", rec.to},
                                       {"FENCED_MS", std::to_string(drive.fenced_us / 1000)}});
        finish(name, out);
      });
    });
  });
}

void MoveDriver::rollback_step(const std::string& name, const MoveRecord& rec) {
  json drop{{"step", "drop"}, {"entitlement", name}};
  hooks_.call(rec.to, drop, [this, name, rec](Result<json> r) {
    if (!drives_.count(name)) return;
    if (!r.ok()) return failed(name, r.error(), "dropping it on the new shard");
    json unfence{{"step", "unfence"}, {"entitlement", name}};
    hooks_.call(rec.from, unfence, [this, name, rec](Result<json> r2) {
      if (!drives_.count(name)) return;
      if (!r2.ok() && r2.error().code != rpc::kNotFound)
        return failed(name, r2.error(), "opening it again on the old shard");
      MoveRecord done = rec;
      done.step = "done";
      write(name, done, [this, name, rec](Status s) {
        if (!s.ok()) return failed(name, s.error(), "ending the move in etcd");
        log_warn("entitlement move rolled back", {{"ENTITLEMENT", name}, {"WHY", rec.why}});
        finish(name, make_error("the move of " + name + " rolled back (it stays on shard " +
                                rec.from + "): " + rec.why)
                         .with_code(rpc::kConflict));
      });
    });
  });
}

void MoveDriver::rollback(const std::string& name, const std::string& why) {
  auto it = drives_.find(name);
  if (it == drives_.end()) return;
  MoveRecord next = it->second.read.record;
  next.step = "rollback";
  next.why = why;
  log_warn("entitlement move rolling back", {{"ENTITLEMENT", name}, {"WHY", why}});
  write(name, next, [this, name](Status s) {
    if (!s.ok()) return after(name, 1'000'000);  // etcd: the record says export still
    step(name);
  });
}

void MoveDriver::finish(const std::string& name, Result<json> r) {
  auto it = drives_.find(name);
  if (it == drives_.end()) return;
  for (auto& w : it->second.waiting) w(r);
  drives_.erase(it);
  timers_.erase(name);
  hooks_.homes_changed();
}

void MoveDriver::round() {
  auto t = loop_.add_timer_in(1'000'000, [this] { round(); });
  if (t.ok()) round_timer_ = std::move(t).value();
  if (reading_) return;
  reading_ = true;
  std::string prefix = prefix_;
  etcd_->post([this, prefix](etcd::Client& c) -> EtcdWorker::Then {
    auto moves = read_moves(c, prefix);
    return [this, moves] {
      reading_ = false;
      if (!moves.ok()) return;
      uint64_t now = now_realtime_us();
      for (const auto& entry : *moves) {
        const std::string& name = entry.first;  // (captured below: not a structured binding)
        const MoveRead& r = entry.second;
        if (drives_.count(name)) continue;
        if (r.record.driver != me_ && now < r.record.beat_us + kMoveStaleUs) continue;
        // Its driver is gone (or is this front end from before a restart): carried on.
        log_info("a move whose front end is gone is carried on here",
                 {{"ENTITLEMENT", name}, {"STEP", r.record.step}, {"DRIVER", r.record.driver}});
        Drive& d = drives_[name];
        d.read = r;
        MoveRecord mine = r.record;
        write(name, mine, [this, name](Status s) {
          if (!s.ok()) return after(name, 1'000'000);
          step(name);
        });
      }
    };
  });
}

}  // namespace weft::cp
