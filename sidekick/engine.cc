#include "sidekick/engine.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <set>

#include "common/clock.h"
#include "common/fs.h"

namespace weft::sidekick {

using json = nlohmann::json;

namespace {

const std::vector<std::string> kMigrations = {
    R"(CREATE TABLE baselines (knob_id TEXT PRIMARY KEY, family TEXT NOT NULL, key TEXT NOT NULL,
                               value TEXT NOT NULL, captured_us INTEGER NOT NULL);
       CREATE TABLE switches (id INTEGER PRIMARY KEY AUTOINCREMENT, from_profile TEXT,
                              to_profile TEXT NOT NULL, state TEXT NOT NULL,
                              started_us INTEGER NOT NULL, finished_us INTEGER NOT NULL DEFAULT 0,
                              detail TEXT NOT NULL DEFAULT '');
       CREATE TABLE undo (switch_id INTEGER NOT NULL, seq INTEGER NOT NULL, knob_id TEXT NOT NULL,
                          family TEXT NOT NULL, key TEXT NOT NULL, prev TEXT NOT NULL,
                          PRIMARY KEY (switch_id, seq));
       CREATE TABLE active (one INTEGER PRIMARY KEY CHECK (one = 1), profile TEXT NOT NULL,
                            knobs TEXT NOT NULL);)",
    R"(CREATE TABLE convergence (knob_id TEXT PRIMARY KEY, family TEXT NOT NULL, key TEXT NOT NULL,
                                 target TEXT NOT NULL, deadline_us INTEGER NOT NULL,
                                 state TEXT NOT NULL, current TEXT NOT NULL DEFAULT '',
                                 switch_id INTEGER NOT NULL, updated_us INTEGER NOT NULL);)",
};

constexpr uint64_t kDefaultSlowDeadlineUs = 600'000'000;  // 10 minutes

int64_t now_us() {
  return static_cast<int64_t>(now_realtime_us());
}

// Fault injection for the crash-recovery tests: WEFT_SIDEKICK_CRASH_AFTER_WRITES=N makes
// the process SIGKILL itself right after its Nth knob write of a switch.
void maybe_crash(int writes) {
  const char* env = std::getenv("WEFT_SIDEKICK_CRASH_AFTER_WRITES");
  if (env && std::atoi(env) == writes) ::raise(SIGKILL);
}

}  // namespace

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kDegraded:
      return "degraded";
    case Outcome::kRebootRequired:
      return "reboot-required";
    case Outcome::kDrift:
      return "drift";
  }
  return "failed";
}

json SwitchReport::to_json() const {
  json ks = json::array();
  for (const auto& k : knobs) {
    json j{{"id", k.id}, {"status", k.status}};
    if (!k.from.empty()) j["from"] = k.from;
    if (!k.to.empty()) j["to"] = k.to;
    if (!k.source.empty()) j["source"] = k.source;
    if (!k.error.empty()) j["error"] = k.error;
    ks.push_back(j);
  }
  json j{
      {"outcome", outcome_name(outcome)}, {"exit_code", static_cast<int>(outcome)}, {"knobs", ks}};
  if (switch_id) j["switch_id"] = switch_id;
  if (duration_us) j["duration_us"] = duration_us;
  if (!error.empty()) j["error"] = error;
  return j;
}

json knob_to_json(const Knob& k) {
  return json{{"id", k.id},
              {"family", k.family},
              {"key", k.key},
              {"value", k.value},
              {"cmp", comparator_name(k.cmp)},
              {"class", class_name(k.klass)},
              {"required", k.required},
              {"source", k.source}};
}

Result<Knob> knob_from_json(const json& j) {
  if (!j.is_object() || !j.contains("id") || !j.contains("family") || !j.contains("key") ||
      !j.contains("value"))
    return make_error("bad stored knob");
  Knob k;
  k.id = j["id"];
  k.family = j["family"];
  k.key = j["key"];
  k.value = j["value"];
  std::string cmp = j.value("cmp", "equal"), cls = j.value("class", "runtime");
  k.cmp = cmp == "at-least"  ? Comparator::kAtLeast
          : cmp == "cpulist" ? Comparator::kCpuList
          : cmp == "mask"    ? Comparator::kMask
                             : Comparator::kEqual;
  k.klass = cls == "disruptive" ? KnobClass::kDisruptive
            : cls == "slow"     ? KnobClass::kSlow
            : cls == "reboot"   ? KnobClass::kReboot
                                : KnobClass::kRuntime;
  k.required = j.value("required", true);
  k.source = j.value("source", "");
  return k;
}

Result<std::unique_ptr<Engine>> Engine::open(const std::string& db_path,
                                             std::unique_ptr<HostKnobs> host) {
  TRY_ASSIGN(auto db, Db::open(db_path));
  TRY_CTX(db->migrate(kMigrations), "sidekick journal");
  std::unique_ptr<Engine> e(new Engine(std::move(db), std::move(host)));
  TRY(e->load_active());
  return e;
}

Status Engine::load_active() {
  TRY_ASSIGN(Stmt st, db_->prepare("SELECT profile, knobs FROM active WHERE one = 1"));
  TRY_ASSIGN(bool row, st.step());
  active_.reset();
  active_knobs_.clear();
  if (!row) return {};
  active_ = st.col_text(0);
  json ks = json::parse(st.col_text(1), nullptr, false);
  if (ks.is_array())
    for (const auto& j : ks)
      if (auto k = knob_from_json(j); k.ok()) active_knobs_.push_back(std::move(k).value());
  return {};
}

std::optional<std::string> Engine::active_profile() const {
  return active_;
}

Result<std::optional<std::string>> Engine::baseline(const std::string& id) {
  TRY_ASSIGN(Stmt st, db_->prepare("SELECT value FROM baselines WHERE knob_id = ?1"));
  st.bind(1, id);
  TRY_ASSIGN(bool row, st.step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(st.col_text(0));
}

Result<Plan> Engine::plan(const Profile& target) {
  Plan p;
  p.from_profile = active_.value_or("");
  p.to_profile = target.name;
  TRY_ASSIGN(std::vector<Knob> knobs, host_->expand(target.knobs));
  std::set<std::string> ids;
  for (const auto& k : knobs) {
    ids.insert(k.id);
    auto cur = host_->read(k.family, k.key);
    if (k.klass == KnobClass::kReboot) {
      if (!cur.ok() || *cur != "present") p.reboot_pending.push_back(k.key);
      p.unchanged.push_back(k);
      continue;
    }
    if (cur.ok() && knob_satisfied(k.cmp, k.value, *cur)) {
      p.unchanged.push_back(k);
    } else {
      p.changes.push_back({k, cur.ok() ? *cur : "", false});
    }
  }
  // Knobs the active profile set that the target does not: back to their baselines.
  for (const auto& k : active_knobs_) {
    if (ids.count(k.id) || k.klass == KnobClass::kReboot) continue;
    TRY_ASSIGN(auto base, baseline(k.id));
    if (!base) continue;
    Knob r = k;
    r.value = *base;
    r.cmp = Comparator::kEqual;
    r.required = false;  // restoring is best effort: the device may be gone
    r.source = "baseline";
    auto cur = host_->read(k.family, k.key);
    if (cur.ok() && knob_satisfied(r.cmp, r.value, *cur)) continue;
    p.changes.push_back({r, cur.ok() ? *cur : "", true});
  }
  std::stable_sort(p.changes.begin(), p.changes.end(),
                   [](const Change& a, const Change& b) { return a.knob.order < b.knob.order; });
  return p;
}

Status Engine::write_checked(const Knob& k, const std::string& value) {
  if (!fail_id_.empty() && k.id == fail_id_)
    return errno_error(EIO, "injected failure writing " + k.id);
  TRY(host_->write(k.family, k.key, value));
  TRY_ASSIGN(std::string now, host_->read(k.family, k.key));
  if (!knob_satisfied(k.cmp, value, now))
    return make_error("wrote '" + value + "' but the kernel reports '" + now + "'");
  return {};
}

Status Engine::finish_switch(int64_t id, const char* state, const std::string& detail) {
  TRY_ASSIGN(
      Stmt st,
      db_->prepare("UPDATE switches SET state = ?2, finished_us = ?3, detail = ?4 WHERE id = ?1"));
  st.bind(1, id).bind(2, std::string(state)).bind(3, now_us()).bind(4, detail);
  return st.run();
}

Status Engine::rollback(int64_t switch_id, std::vector<KnobReport>* reports) {
  if (auto del = db_->prepare("DELETE FROM convergence WHERE switch_id = ?1"); del.ok()) {
    del->bind(1, switch_id);
    (void)del->run();
  }
  TRY_ASSIGN(
      Stmt st,
      db_->prepare(
          "SELECT knob_id, family, key, prev FROM undo WHERE switch_id = ?1 ORDER BY seq DESC"));
  st.bind(1, switch_id);
  Status first_error;
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    std::string id = st.col_text(0), family = st.col_text(1), key = st.col_text(2),
                prev = st.col_text(3);
    Status s = prev.empty() ? Status() : host_->write(family, key, prev);
    if (reports)
      reports->push_back({id, "", prev, "", s.ok() ? "rolled-back" : "rollback-failed",
                          s.ok() ? "" : s.error().str()});
    if (!s.ok() && first_error.ok()) first_error = std::move(s).error();
  }
  return first_error;
}

Result<std::optional<int64_t>> Engine::recover() {
  TRY_ASSIGN(Stmt st, db_->prepare("SELECT id FROM switches WHERE state = 'applying' ORDER BY id"));
  std::optional<int64_t> last;
  std::vector<int64_t> ids;
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    ids.push_back(st.col_int(0));
  }
  for (int64_t id : ids) {
    Status s = rollback(id, nullptr);
    TRY(finish_switch(id, "rolled-back",
                      std::string("interrupted; rolled back on restart") +
                          (s.ok() ? "" : ": " + s.error().str())));
    last = id;
  }
  return last;
}

SwitchReport Engine::apply(const Profile& target) {
  uint64_t t0 = now_monotonic_us();
  SwitchReport rep = apply_timed(target);
  rep.duration_us = now_monotonic_us() - t0;
  return rep;
}

// The journal's entries for one change, durable before the kernel sees the write: the
// knob's baseline (its first touch only) and this switch's undo entry, number `seq`.
Status Engine::journal_change(const Change& c, int64_t switch_id, int seq) {
  const Knob& k = c.knob;
  Status s;
  if (!c.restore && c.from.empty()) {
    // Unreadable now means unrestorable later: never write what we could not put back.
    s = make_error("cannot read its current value (is the setting present on this machine?)");
  } else if (!c.restore) {
    auto base = baseline(k.id);
    if (base.ok() && !*base) {
      auto ins = db_->prepare(
          "INSERT INTO baselines (knob_id, family, key, value, captured_us) VALUES "
          "(?1,?2,?3,?4,?5)");
      if (ins.ok()) {
        ins->bind(1, k.id).bind(2, k.family).bind(3, k.key).bind(4, c.from).bind(5, now_us());
        s = ins->run();
      } else {
        s = std::move(ins).error();
      }
    } else if (!base.ok()) {
      s = base.error();
    }
  }
  if (s.ok()) {
    auto undo = db_->prepare(
        "INSERT INTO undo (switch_id, seq, knob_id, family, key, prev) VALUES "
        "(?1,?2,?3,?4,?5,?6)");
    if (undo.ok()) {
      undo->bind(1, switch_id)
          .bind(2, int64_t{seq})
          .bind(3, k.id)
          .bind(4, k.family)
          .bind(5, k.key)
          .bind(6, c.from);
      s = undo->run();
    } else {
      s = std::move(undo).error();
    }
  }
  return s;
}

// The switch committed in one transaction: the new active profile recorded, the baselines
// of knobs that left it released, the switch marked committed.
Status Engine::commit_switch(const Plan& p, const Profile& target, int64_t switch_id) {
  json ks = json::array();
  auto expanded = host_->expand(target.knobs);
  if (expanded.ok())
    for (const auto& k : *expanded) ks.push_back(knob_to_json(k));
  Status s = db_->begin();
  if (!s.ok()) return s;
  for (const auto& c : p.changes) {
    if (!c.restore) continue;
    auto del = db_->prepare("DELETE FROM baselines WHERE knob_id = ?1");
    if (del.ok()) {
      del->bind(1, c.knob.id);
      s = del->run();
    }
  }
  auto act = db_->prepare("INSERT OR REPLACE INTO active (one, profile, knobs) VALUES (1, ?1, ?2)");
  if (act.ok()) {
    act->bind(1, target.name).bind(2, ks.dump());
    if (s.ok()) s = act->run();
  }
  auto fin =
      db_->prepare("UPDATE switches SET state = 'committed', finished_us = ?2 WHERE id = ?1");
  if (fin.ok()) {
    fin->bind(1, switch_id).bind(2, now_us());
    if (s.ok()) s = fin->run();
  }
  if (s.ok())
    s = db_->commit();
  else
    db_->rollback();
  return s;
}

SwitchReport Engine::apply_timed(const Profile& target) {
  SwitchReport rep;
  auto planned = plan(target);
  if (!planned.ok()) {
    rep.outcome = Outcome::kFailed;
    rep.error = planned.error().str();
    return rep;
  }
  const Plan& p = *planned;
  auto fail = [&](std::string why) {
    rep.outcome = Outcome::kFailed;
    rep.error = std::move(why);
    return rep;
  };
  {
    auto st = db_->prepare(
        "INSERT INTO switches (from_profile, to_profile, state, started_us) VALUES (?1, ?2, "
        "'applying', ?3)");
    if (!st.ok()) return fail(st.error().str());
    st->bind(1, p.from_profile).bind(2, p.to_profile).bind(3, now_us());
    if (auto s = st->run(); !s.ok()) return fail(s.error().str());
    rep.switch_id = sqlite3_last_insert_rowid(db_->raw());
  }
  int seq = 0, writes = 0;
  bool degraded = false;
  for (const auto& c : p.changes) {
    const Knob& k = c.knob;
    KnobReport kr{k.id, c.from, k.value, k.source, "applied", ""};
    // Journal first: the baseline (first touch only) and this switch's undo entry are
    // durable before the kernel sees the write.
    Status s = journal_change(c, rep.switch_id, ++seq);
    if (s.ok() && k.klass == KnobClass::kSlow && !c.restore) {
      s = apply_slow(k, rep.switch_id, &kr);
      maybe_crash(++writes);
    } else if (s.ok()) {
      s = write_checked(k, k.value);
      maybe_crash(++writes);
    }
    if (!s.ok()) {
      kr.status = "failed";
      kr.error = s.error().str();
      if (k.required) {
        rep.knobs.push_back(kr);
        rep.error = k.id + " (" + k.source + "): " + s.error().str();
        rollback(rep.switch_id, &rep.knobs).ok();
        (void)finish_switch(rep.switch_id, "rolled-back", rep.error);
        rep.outcome = Outcome::kFailed;
        return rep;
      }
      // Best effort: put this one knob back and carry on.
      if (!c.from.empty()) (void)host_->write(k.family, k.key, c.from);
      degraded = true;
    }
    rep.knobs.push_back(kr);
  }
  for (const auto& k : p.unchanged)
    if (k.klass != KnobClass::kReboot) rep.knobs.push_back({k.id, "", k.value, k.source, "ok", ""});
  for (const auto& arg : p.reboot_pending)
    rep.knobs.push_back({"kernel:" + arg, "absent", "present", "", "reboot-required", ""});

  Status s = commit_switch(p, target, rep.switch_id);
  if (!s.ok()) {
    rollback(rep.switch_id, &rep.knobs).ok();
    (void)finish_switch(rep.switch_id, "rolled-back", "journal commit failed: " + s.error().str());
    return fail("journal commit failed: " + s.error().str());
  }
  (void)load_active();
  rep.outcome = !p.reboot_pending.empty() ? Outcome::kRebootRequired
                : degraded                ? Outcome::kDegraded
                                          : Outcome::kOk;
  return rep;
}

SwitchReport Engine::off() {
  SwitchReport rep;
  (void)db_->exec("DELETE FROM convergence");
  auto st = db_->prepare("SELECT knob_id, family, key, value FROM baselines ORDER BY knob_id");
  if (!st.ok()) {
    rep.outcome = Outcome::kFailed;
    rep.error = st.error().str();
    return rep;
  }
  std::vector<std::array<std::string, 4>> rows;
  for (;;) {
    auto row = st->step();
    if (!row.ok() || !*row) break;
    rows.push_back({st->col_text(0), st->col_text(1), st->col_text(2), st->col_text(3)});
  }
  bool failed = false;
  for (auto it = rows.rbegin(); it != rows.rend(); ++it) {
    const auto& [id, family, key, value] = *it;
    Status s = host_->write(family, key, value);
    rep.knobs.push_back(
        {id, "", value, "baseline", s.ok() ? "restored" : "failed", s.ok() ? "" : s.error().str()});
    if (!s.ok()) {
      failed = true;
      continue;  // keep its baseline for the next attempt
    }
    auto del = db_->prepare("DELETE FROM baselines WHERE knob_id = ?1");
    if (del.ok()) {
      del->bind(1, id);
      (void)del->run();
    }
  }
  if (!failed) {
    (void)db_->exec("DELETE FROM active");
    auto ins = db_->prepare(
        "INSERT INTO switches (from_profile, to_profile, state, started_us, finished_us) VALUES "
        "(?1, 'off', 'committed', ?2, ?2)");
    if (ins.ok()) {
      ins->bind(1, active_.value_or("")).bind(2, now_us());
      (void)ins->run();
    }
  }
  (void)load_active();
  rep.outcome = failed ? Outcome::kFailed : Outcome::kOk;
  if (failed)
    rep.error = "some baselines could not be restored; they are kept for the next attempt";
  return rep;
}

SwitchReport Engine::verify() {
  SwitchReport rep;
  bool drift = false, reboot = false, degraded = false;
  for (const auto& k : active_knobs_) {
    auto cur = host_->read(k.family, k.key);
    if (k.klass == KnobClass::kReboot) {
      bool ok = cur.ok() && *cur == "present";
      reboot |= !ok;
      rep.knobs.push_back(
          {k.id, cur.ok() ? *cur : "", "present", k.source, ok ? "ok" : "reboot-required", ""});
      continue;
    }
    bool ok = cur.ok() && knob_satisfied(k.cmp, k.value, *cur);
    if (!ok) (k.required ? drift : degraded) = true;
    rep.knobs.push_back({k.id, cur.ok() ? *cur : "", k.value, k.source, ok ? "ok" : "drift",
                         cur.ok() ? "" : cur.error().str()});
  }
  rep.outcome = drift      ? Outcome::kDrift
                : reboot   ? Outcome::kRebootRequired
                : degraded ? Outcome::kDegraded
                           : Outcome::kOk;
  return rep;
}

Status Engine::apply_slow(const Knob& k, int64_t switch_id, KnobReport* kr) {
  if (!fail_id_.empty() && k.id == fail_id_)
    return errno_error(EIO, "injected failure writing " + k.id);
  TRY(host_->write(k.family, k.key, k.value));
  TRY_ASSIGN(std::string now, host_->read(k.family, k.key));
  if (knob_satisfied(k.cmp, k.value, now)) return {};
  uint64_t deadline = now_realtime_us() + (k.deadline_us ? k.deadline_us : kDefaultSlowDeadlineUs);
  if (k.wait) {
    // The profile asked the switch to wait: converge here, then succeed or fail.
    while (now_realtime_us() < deadline) {
      TRY_ASSIGN(bool done, converge_once(k.family, k.key, k.value, &now));
      if (done) return {};
      ::usleep(100000);
    }
    return make_error("reached only " + now + " of " + k.value + " before its deadline");
  }
  // Converge in the background; the rest of the switch does not wait.
  TRY_ASSIGN(Stmt st,
             db_->prepare("INSERT OR REPLACE INTO convergence (knob_id, family, key, target, "
                          "deadline_us, state, current, "
                          "switch_id, updated_us) VALUES (?1,?2,?3,?4,?5,'converging',?6,?7,?8)"));
  st.bind(1, k.id).bind(2, k.family).bind(3, k.key).bind(4, k.value);
  st.bind(5, static_cast<int64_t>(deadline)).bind(6, now).bind(7, switch_id).bind(8, now_us());
  TRY(st.run());
  kr->status = "converging";
  kr->error = now + "/" + k.value;
  return {};
}

Result<bool> Engine::converge_once(const std::string& family, const std::string& key,
                                   const std::string& target, std::string* current) {
  // Compaction frees contiguous memory for the next attempt; it may not exist (fake
  // trees, some kernels), which only makes convergence slower.
  (void)host_->write("sysctl", "vm.compact_memory", "1");
  TRY(host_->write(family, key, target));
  TRY_ASSIGN(*current, host_->read(family, key));
  return knob_satisfied(Comparator::kEqual, target, *current);
}

Result<json> Engine::converge_step() {
  TRY_ASSIGN(Stmt st, db_->prepare("SELECT knob_id, family, key, target, deadline_us FROM "
                                   "convergence WHERE state = 'converging'"));
  std::vector<std::array<std::string, 4>> rows;
  std::vector<int64_t> deadlines;
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    rows.push_back({st.col_text(0), st.col_text(1), st.col_text(2), st.col_text(3)});
    deadlines.push_back(st.col_int(4));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [id, family, key, target] = rows[i];
    std::string current;
    auto done = converge_once(family, key, target, &current);
    std::string state = done.ok() && *done        ? "converged"
                        : now_us() > deadlines[i] ? "failed"
                                                  : "converging";
    TRY_ASSIGN(
        Stmt up,
        db_->prepare(
            "UPDATE convergence SET state = ?2, current = ?3, updated_us = ?4 WHERE knob_id = ?1"));
    up.bind(1, id).bind(2, state).bind(3, current).bind(4, now_us());
    TRY(up.run());
  }
  return convergence();
}

Result<json> Engine::convergence() {
  TRY_ASSIGN(
      Stmt st,
      db_->prepare(
          "SELECT knob_id, target, current, state, deadline_us FROM convergence ORDER BY knob_id"));
  json out = json::array();
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    out.push_back({{"id", st.col_text(0)},
                   {"target", st.col_text(1)},
                   {"current", st.col_text(2)},
                   {"progress", st.col_text(2) + "/" + st.col_text(1)},
                   {"state", st.col_text(3)},
                   {"deadline_at", format_rfc3339(st.col_int(4))}});
  }
  return out;
}

Result<json> Engine::history(int limit) {
  TRY_ASSIGN(
      Stmt st,
      db_->prepare("SELECT id, from_profile, to_profile, state, started_us, finished_us, detail "
                   "FROM switches ORDER BY id DESC LIMIT ?1"));
  st.bind(1, int64_t{limit});
  json out = json::array();
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    out.push_back({{"id", st.col_int(0)},
                   {"from", st.col_text(1)},
                   {"to", st.col_text(2)},
                   {"state", st.col_text(3)},
                   {"started_at", format_rfc3339(st.col_int(4))},
                   {"finished_at", format_rfc3339(st.col_int(5))},
                   {"detail", st.col_text(6)}});
  }
  return out;
}

}  // namespace weft::sidekick
