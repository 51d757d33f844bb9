// Group commit: the control plane writes before it answers, and it writes in groups.
//
// The first write of a loop iteration opens a group (one store transaction) and holds
// every session's output (rpc::OutputGate): replies and commands wait. The group commits
// when the loop has nothing else pending, or once it is max_age old however busy the
// loop stays, and only then is anything sent. So one commit covers every call read in
// the meantime, and nothing is said that the store does not hold.
//
// A group the store does not take is abandoned, and what it covered (the keys in
// `Written`) goes back to what the next write must cover; a retry comes soon:
//  - a replicated store (etcd): nothing held is sent (a command sent now might not be
//    known to the next leader); retried every 200 ms, the output held until it commits;
//  - the control plane's own disk: the held replies go out (answered from memory; all
//    of it is written again); retried every second;
//  - fenced out (another control plane leads): nothing is sent, the owner steps down.
//
// With a store that commits off the loop (etcd: GroupWrites::async_commits), a group is
// sealed and sent, and the loop goes on while etcd writes it; the next group fills
// meanwhile and is sealed when the one in flight has committed (one group in flight at a
// time, so a slow store makes groups larger, not a queue longer). Output is released by
// epoch (rpc::OutputGate::seal): what was said before a group was sealed goes out when
// it has committed, what was said after waits for the next one. A group etcd does not
// take holds everything newer too, until the rewrite of its keys has committed.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/event.h"
#include "common/metrics.h"
#include "common/rpc/session.h"
#include "controlplane/machines/broker.h"
#include "controlplane/store/notes.h"
#include "controlplane/store/state_store.h"

namespace weft::cp {

// What writes covered, by key: written again when their group is not taken.
struct Written {
  std::set<MachineId> machines;
  std::unordered_set<std::string> tasks;
  std::set<std::string> jobs;
  std::vector<Unavailability> events;  // oldest first
  std::set<uint64_t> maintenance;
  Notes::Pending notes;  // the features' notes (notes.h), their latest values
  // Adds `newer` (its events after these, its notes' values over these).
  void add(const Written& newer);
  bool empty() const {
    return machines.empty() && tasks.empty() && jobs.empty() && events.empty() &&
           maintenance.empty() && notes.empty();
  }
};

class GroupCommit {
 public:
  struct Options {
    bool replicated = false;       // a group not taken holds its output (etcd)
    uint64_t max_age_us = 20'000;  // a group commits by this age however busy the loop
    uint64_t retry_us = 1'000'000;
  };
  struct Hooks {
    std::function<bool()> rewrite;  // writes unsaved() again in a new group; false: failed
    std::function<void(const std::string& why)> deposed;  // fenced out: step down
    // A group committed in `took_us`; `ended_hold`: it ends a run of refused ones.
    std::function<void(uint64_t took_us, bool ended_hold)> committed;
  };
  GroupCommit(EventLoop& loop, GroupWrites& store, rpc::OutputGate& gate, Options opts,
              Hooks hooks);
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Opens a group unless one is open or writes are synchronous now.
  Status open();
  // Commits the open group (if any) and releases the output, or fails as above; with a
  // pipelining store, after every group in flight (it waits for them).
  void commit();
  // While on, no group is opened: each write is its own transaction (an operator's call
  // on a local disk, which must hear whether its change was written).
  void set_sync(bool on) { sync_ = on; }
  // After writes that covered `w`: kept until the open group commits. In a group open
  // past max_age, commits now (under constant load).
  void wrote(const Written& w);
  // What the next write must cover (written to by the owner, kept across failed groups).
  Written& unsaved() { return unsaved_; }

  // Whether the output is held because the store refused the last groups.
  bool held() const { return held_; }
  // Groups sent and not yet answered (pipelining stores).
  size_t in_flight() const { return in_flight_; }
  // Since when (the monotonic clock, µs) the oldest output still held has waited for its
  // group to commit; 0 when none waits. A store slow to take a group holds every reply,
  // and a machine daemon with its report unanswered sends no other: its silence then is
  // the control plane's own (Manager::check_machines).
  uint64_t waiting_since_us() const {
    return in_flight_ > 0 ? in_flight_opened_us_ : store_.in_batch() ? started_us_ : 0;
  }
  uint64_t failures() const { return failures_; }
  // Before an operator's change on a store that is not replicated: the open group
  // committed, then a probe write (GroupWrites::probe_write). An error (ENOSPC, say)
  // means the disk takes nothing now: the change is refused before it is applied.
  Status ready_for_change();
  // Whether the last group the store answered was refused (a full or failing disk, etcd
  // away): set by a failure, cleared by the next group that commits.
  bool failing() const { return failing_; }
  const metrics::Histogram& seconds() const { return seconds_; }

 private:
  void failed(const Status& why);
  // The group's end, by the idle defer or the age timer: sealed and sent when the store
  // pipelines (after the group in flight), else commit().
  void commit_soon();
  void sent(uint64_t epoch, Written group, bool covers_rewrite, uint64_t t0, Status st);
  void retry_later();

  EventLoop& loop_;
  GroupWrites& store_;
  rpc::OutputGate& gate_;
  const Options opts_;
  Hooks hooks_;
  Written group_, unsaved_;
  bool sync_ = false, held_ = false, retry_armed_ = false, failing_ = false;
  size_t in_flight_ = 0;
  bool seal_waiting_ = false;  // the open group is due, after the one in flight
  // A pipelined group failed: nothing newer is released until a group that carries the
  // rewrite of its keys (any write after the failure: persist writes unsaved()) commits.
  bool blocked_ = false, covers_rewrite_ = false;
  uint64_t started_us_ = 0, failure_logged_us_ = 0, failures_ = 0;
  uint64_t in_flight_opened_us_ = 0;  // when the group in flight was opened
  Source commit_, deadline_, retry_;
  metrics::Histogram seconds_;
};

}  // namespace weft::cp
