// A shard's side of moving an entitlement between a region's shards (docs/regions.md,
// "Moving an entitlement"; the front end drives the move: moves.h, and records it in
// etcd: region.h MoveRecord). Nothing restarts: the tasks run on where they are while
// their records change shard, and the machines' daemons follow their holder record.
//
//   old shard   out()     fences the entitlement (Scheduler::fence: nothing acts for
//                         it) and writes it out as a MoveDoc
//   new shard   in()      reads the document in, fenced, under its own ids; its
//                         machines are expected (not dead) for kArrivalUs
//   (the front end moves the entitlement's home: the move is decided)
//   new shard   open()    takes over the machines' holder records and unfences: its
//                         scheduler carries on exactly where the old one stopped
//   old shard   forget()  drops the entitlement without a command to its machines, and
//                         closes their sessions: the daemons go where their holder is
//   or, before the home moved:
//   new shard   drop()    forgets what in() read
//   old shard   unfence() carries on as before (the next full reports say what changed)
//
// Each step may be asked again (a front end that died, a resumed move) and answers as the
// first time did. The fences are not stored: at the start of a leader's term load()
// reads the moves under way and fences again, rolls forward a forget the old leader did
// not finish, and drops what a rolled-back move left.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/machines/broker.h"
#include "controlplane/region/checks.h"
#include "controlplane/region/lending.h"
#include "controlplane/region/move_doc.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

class EntitlementMoves {
 public:
  struct Hooks {
    // Writes what changed (jobs, machines, every entitlement) into the open group; the
    // reply is held until the group commits.
    std::function<Status(const std::set<std::string>& jobs, const std::set<MachineId>& machines)>
        persist;
    std::function<Status(EntitlementId)> delete_entitlement;  // its row
    // The machine is no longer this shard's: its daemons' sessions closed, listed no more.
    std::function<Status(MachineId, const char* why)> forget_machine;
    std::function<Lending*()> lending;
    std::function<void()> kick;  // a tick soon: what waited on the entitlement goes on
    // Its host profile roll (profile_rolls.h): fenced with it, written out, taken in.
    std::function<void(EntitlementId, bool)> fence_roll;
    std::function<std::optional<ProfileRolls::Moved>(EntitlementId)> roll_of;
    std::function<void(EntitlementId, const ProfileRolls::Moved&,
                       const std::map<std::string, MachineId>&)>
        adopt_roll;
    // The region's records, which every step is checked against before it is done
    // (region_checks.h); null: not checked (unit tests without etcd).
    std::function<RegionChecks*()> checks;
  };
  EntitlementMoves(const CpConfig& cfg, Allocator& alloc, Broker& broker, Scheduler& sched,
                   Hooks hooks)
      : cfg_(cfg), alloc_(alloc), broker_(broker), sched_(sched), hooks_(std::move(hooks)) {
    // Tests: smaller pages, so that a small entitlement goes in several.
    if (const char* v = std::getenv("WEFT_TEST_MOVE_PAGE_BYTES"))
      page_bytes_ = std::clamp<size_t>(std::strtoull(v, nullptr, 10), 64, kPageBytes);
  }

  // At the start of a term, after the state is restored (synchronous etcd reads).
  Status load(uint64_t now_us);
  // region.move: {"step", "entitlement", "from"/"to", "document"}; a front end's call.
  // The step is done only if the move's record in etcd says it (Hooks::checks).
  void call(const nlohmann::json& p, uint64_t now_us, rpc::ReplyFn reply);
  ~EntitlementMoves() { *alive_ = false; }
  EntitlementMoves(const EntitlementMoves&) = delete;
  EntitlementMoves& operator=(const EntitlementMoves&) = delete;
  // Where an entitlement is going or coming from (entitlement.show), null when it is not
  // moving.
  nlohmann::json status(EntitlementId e) const;

  // How long the new shard waits for a moved machine's daemons before it is dead.
  static constexpr uint64_t kArrivalUs = 60'000'000;

 private:
  // The step checked: done, and answered.
  void act(const nlohmann::json& p, uint64_t now_us, rpc::ReplyFn reply);
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  struct Moving {
    bool outgoing = true;  // this shard is the old one
    std::string other;     // the other shard
    uint64_t since_us = 0;
  };
  // The document goes in pages (a session's line is at most 1 MiB): out answers the
  // first, `page` each next; `in` takes them in order and reads the document in with the
  // last.
  static constexpr size_t kPageBytes = 256 * 1024;
  static constexpr size_t kMaxDocBytes = 512ull * 1024 * 1024;
  Result<nlohmann::json> out(const std::string& name, const std::string& to, uint64_t now);
  Result<nlohmann::json> page_of(const std::string& name, size_t page) const;
  Result<nlohmann::json> receive(const std::string& name, const std::string& from,
                                 const nlohmann::json& p, uint64_t now);
  struct Exported {
    std::string text;          // the document as written at the fence
    std::vector<size_t> cuts;  // where each page ends
    nlohmann::json counts;
  };
  std::map<std::string, Exported> exported_;  // by entitlement name, until forgotten
  struct Incoming {
    std::string from;
    uint64_t pages = 0, next = 0;
    std::string text;
  };
  std::map<std::string, Incoming> incoming_;
  size_t page_bytes_ = kPageBytes;
  Result<nlohmann::json> in(const MoveDoc& d, const std::string& from, uint64_t now);
  void open(const std::string& name, uint64_t now, rpc::ReplyFn reply);
  Result<nlohmann::json> forget(const std::string& name, const std::string& to);
  Result<nlohmann::json> drop(const std::string& name);
  Result<nlohmann::json> unfence(const std::string& name);
  MoveDoc document(EntitlementId e, uint64_t now) const;
  // The scheduler's fence and the profile roll's, together.
  void fence(EntitlementId e, bool on) {
    sched_.handover().fence(e, on);
    if (hooks_.fence_roll) hooks_.fence_roll(e, on);
  }
  // The machines that go with it: its own, and free ones still running its tasks.
  std::set<MachineId> machines_of(EntitlementId e) const;
  // Forgets the entitlement's jobs, machines and itself (`why` recorded for its machines).
  Status remove(EntitlementId e, const char* why);

  const CpConfig& cfg_;
  Allocator& alloc_;
  Broker& broker_;
  Scheduler& sched_;
  Hooks hooks_;
  std::map<EntitlementId, Moving> moving_;
};

}  // namespace weft::cp
