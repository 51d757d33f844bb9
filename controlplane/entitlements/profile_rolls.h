// An entitlement's new host profile rolled over its machines, `pace` at a time (docs/
// jobs.md, "Changing an entitlement"). Each machine of the entitlement is held at the old
// profile (Broker::hold_profile) until its turn; then it is released to the new one, and
// the next goes once it applied it (or left the entitlement, or is not healthy: a dead
// machine is not waited for). The tasks keep running: sidekick applies the difference.
//
// A state machine over the allocator (which machines an entitlement has) and the broker
// (held profiles, what each machine applied): advance() is called every tick and returns
// the machines it released, whose sidekicks the caller tells. Each roll is a note
// (store/notes.h, "profile-roll/<entitlement id>": the Moved form, in machine names),
// written as it changes: a control plane that restarts or takes over mid-roll goes on
// where the roll was (restore), the machines still waiting held at the old profile. An
// entitlement that moves to another shard takes its roll along (moved, adopt): it goes
// on there where it was, and while the entitlement is fenced for the move it does not
// advance.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/machines/broker.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/store/notes.h"

namespace weft::cp {

class ProfileRolls {
 public:
  ProfileRolls(const Allocator& alloc, Broker& broker, Notes& notes)
      : alloc_(alloc), broker_(broker), notes_(notes) {}

  // Starts one for entitlement e, whose profile just changed from `from`: every machine
  // of e not held already is held at `from`, in turn.
  void start(EntitlementId e, const std::string& from, size_t pace);
  // Moves every roll on; the machines released now (to be told their new profile).
  std::set<MachineId> advance();
  // Forgets e's roll (e was removed), letting go of the machines it held.
  void forget(EntitlementId e);
  bool rolling(EntitlementId e) const { return rolls_.count(e) > 0; }
  // A roll in machine names (the other shard's ids differ).
  struct Moved {
    std::string from;
    size_t pace = 1;
    std::vector<std::string> waiting;  // in turn
    std::vector<std::string> applying;
    nlohmann::json to_json() const;
    // Errors name the field under `path` ("profile_roll.waiting[2]").
    static Result<Moved> from_json(const nlohmann::json& j, const std::string& path);
  };
  std::optional<Moved> moved(EntitlementId e,
                             const std::function<std::string(MachineId)>& machine_name) const;
  // Takes a moved roll in for e (its machines already e's here): the waiting ones held at
  // its old profile again. A name `id_of` does not know is left out.
  void adopt(EntitlementId e, const Moved& r,
             const std::function<std::optional<MachineId>(const std::string&)>& id_of);
  // The rolls the notes under kNotePrefix hold (a new leader's, after the state was
  // restored): each adopted where it was; one of an entitlement that is gone, or that
  // cannot be read, is dropped (with a warning).
  static constexpr const char* kNotePrefix = "profile-roll/";
  void restore(const std::map<std::string, nlohmann::json>& notes);
  void fence(EntitlementId e, bool on) {
    if (on)
      fenced_.insert(e);
    else
      fenced_.erase(e);
  }
  // What entitlement.show says of it ({"done": true} when none).
  nlohmann::json status(EntitlementId e,
                        const std::function<std::string(MachineId)>& machine_name) const;

 private:
  struct Roll {
    std::string from;
    size_t pace = 1;                 // machines applying at once
    std::vector<MachineId> waiting;  // held at `from`, in turn
    std::set<MachineId> applying;    // released, not yet applied
  };
  // The roll of e as a note again (erased when it has none).
  void save(EntitlementId e);
  const Allocator& alloc_;
  Broker& broker_;
  Notes& notes_;
  std::map<EntitlementId, Roll> rolls_;
  std::set<EntitlementId> fenced_;  // moving to or from another shard: not advanced
};

}  // namespace weft::cp
