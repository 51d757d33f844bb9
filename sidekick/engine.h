// The switch engine: plan (diff the target profile against the machine), apply in
// dependency order, verify each write, commit — or roll back every write of the switch
// when a required knob fails. A durable journal (sqlite) keeps each knob's baseline from
// before weft first touched it and an undo log per switch, so a switch interrupted by
// SIGKILL is rolled back on the next start and `off` restores every baseline.
// Independent of who asks (local API today, the control plane later). Not thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/store.h"
#include "sidekick/host_knobs.h"
#include "sidekick/profile.h"

namespace weft::sidekick {

struct Change {
  Knob knob;
  std::string from;      // current value ("" when unreadable)
  bool restore = false;  // back to its baseline: the new profile no longer sets it
};

struct Plan {
  std::string from_profile, to_profile;
  std::vector<Change> changes;
  std::vector<Knob> unchanged;
  std::vector<std::string> reboot_pending;  // kernel args not yet on /proc/cmdline
};

enum class Outcome { kOk = 0, kFailed = 1, kDegraded = 3, kRebootRequired = 4, kDrift = 5 };
const char* outcome_name(Outcome o);

struct KnobReport {
  std::string id, from, to, source, status,
      error;  // status: applied, failed, skipped, rolled-back, ok, drift
};

struct SwitchReport {
  int64_t switch_id = 0;
  Outcome outcome = Outcome::kOk;
  uint64_t duration_us = 0;  // plan + apply + verify + commit, measured by the engine
  std::string error;         // which knob and why, when failed
  std::vector<KnobReport> knobs;
  nlohmann::json to_json() const;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> open(const std::string& db_path,
                                              std::unique_ptr<HostKnobs> host);

  // Rolls back a switch left half-done by a crash. Call once at start.
  Result<std::optional<int64_t>> recover();
  std::optional<std::string> active_profile() const;

  Result<Plan> plan(const Profile& target);
  SwitchReport apply(const Profile& target);
  // Restores every baseline and forgets the active profile.
  SwitchReport off();
  // Compares the machine with the active profile.
  SwitchReport verify();
  Result<nlohmann::json> history(int limit);
  // Slow knobs (huge pages) that did not reach their target at switch time converge in
  // the background: each step compacts memory and asks again. States: converging,
  // converged, failed (deadline passed). Call converge_step about once a second while
  // any knob is converging.
  Result<nlohmann::json> converge_step();
  Result<nlohmann::json> convergence();
  // Test hook: fail the write of this knob id (fault injection).
  void fail_write_of(std::string id) { fail_id_ = std::move(id); }

 private:
  Engine(std::unique_ptr<Db> db, std::unique_ptr<HostKnobs> host)
      : db_(std::move(db)), host_(std::move(host)) {}
  SwitchReport apply_timed(const Profile& target);
  Status apply_slow(const Knob& k, int64_t switch_id, KnobReport* kr);
  Status journal_change(const Change& c, int64_t switch_id, int seq);
  Status commit_switch(const Plan& p, const Profile& target, int64_t switch_id);
  Result<bool> converge_once(const std::string& family, const std::string& key,
                             const std::string& target, std::string* current);
  Status load_active();
  std::vector<Knob> active_knobs() const { return active_knobs_; }
  Result<std::optional<std::string>> baseline(const std::string& id);
  Status rollback(int64_t switch_id, std::vector<KnobReport>* reports);
  Status write_checked(const Knob& k, const std::string& value);
  Status finish_switch(int64_t id, const char* state, const std::string& detail);

  std::unique_ptr<Db> db_;
  std::unique_ptr<HostKnobs> host_;
  std::optional<std::string> active_;
  std::vector<Knob> active_knobs_;
  std::string fail_id_;
};

nlohmann::json knob_to_json(const Knob& k);
Result<Knob> knob_from_json(const nlohmann::json& j);

}  // namespace weft::sidekick
