#include "controlplane/store/group_commit.h"

#include <systemd/sd-event.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/protocol.h"

namespace weft::cp {

namespace {
uint64_t mono_us() {
  return now_monotonic_us();
}
}  // namespace

void Written::add(const Written& newer) {
  machines.insert(newer.machines.begin(), newer.machines.end());
  tasks.insert(newer.tasks.begin(), newer.tasks.end());
  jobs.insert(newer.jobs.begin(), newer.jobs.end());
  events.insert(events.end(), newer.events.begin(), newer.events.end());
  maintenance.insert(newer.maintenance.begin(), newer.maintenance.end());
  for (const auto& [key, value] : newer.notes) notes[key] = value;
}

GroupCommit::GroupCommit(EventLoop& loop, GroupWrites& store, rpc::OutputGate& gate, Options opts,
                         Hooks hooks)
    : loop_(loop), store_(store), gate_(gate), opts_(opts), hooks_(std::move(hooks)) {}

Status GroupCommit::open() {
  if (sync_ || store_.in_batch()) return {};
  TRY(store_.open_batch());
  gate_.hold();
  started_us_ = mono_us();
  // Idle priority: after every session with input pending has been read, so one
  // commit covers all of them.
  auto d = loop_.add_defer([this] { commit_soon(); });
  if (d.ok()) {
    commit_ = std::move(d).value();
    (void)commit_.set_priority(SD_EVENT_PRIORITY_IDLE);
  }
  // And at the latest max_age later, however busy the loop stays (a stream of reads
  // that never lets it go idle would otherwise hold the group's replies).
  auto t = loop_.add_timer_in(opts_.max_age_us, [this] { commit_soon(); });
  if (t.ok()) {
    deadline_ = std::move(t).value();
    (void)deadline_.set_priority(SD_EVENT_PRIORITY_IMPORTANT);
  }
  return {};
}

void GroupCommit::wrote(const Written& w) {
  if (!store_.in_batch()) return;  // its own transaction: durable already
  group_.add(w);
  if (blocked_) covers_rewrite_ = true;
  if (mono_us() - started_us_ > opts_.max_age_us) commit_soon();  // under constant load
}

void GroupCommit::commit_soon() {
  if (!store_.async_commits()) return commit();
  if (!store_.in_batch()) return;
  if (in_flight_ > 0) {
    seal_waiting_ = true;  // sealed when the group in flight has committed
    return;
  }
  seal_waiting_ = false;
  uint64_t epoch = gate_.seal();
  Written group = std::move(group_);
  group_ = {};
  bool covers = std::exchange(covers_rewrite_, false);
  ++in_flight_;
  in_flight_opened_us_ = started_us_;
  uint64_t t0 = mono_us();
  store_.commit_batch_async(loop_,
                            [this, epoch, group = std::move(group), covers, t0](Status st) mutable {
                              sent(epoch, std::move(group), covers, t0, std::move(st));
                            });
}

void GroupCommit::sent(uint64_t epoch, Written group, bool covers_rewrite, uint64_t t0, Status st) {
  --in_flight_;
  uint64_t took = mono_us() - t0;
  seconds_.observe(static_cast<double>(took) / 1e6);
  if (st.ok()) {
    failing_ = false;
    if (blocked_ && covers_rewrite) blocked_ = false;
    if (!blocked_) {
      bool ended_hold = std::exchange(held_, false);
      if (hooks_.committed) hooks_.committed(took, ended_hold);
      // Everything said is durable when nothing is open or in flight: the gate opens.
      if (in_flight_ == 0 && !store_.in_batch())
        gate_.release();
      else
        gate_.release_through(epoch);
    }
  } else if (store_.fenced_out()) {
    // Deposed: nothing this control plane holds may be sent (another leader acts now).
    if (store_.in_batch()) store_.abandon_batch();
    group_ = {};
    hooks_.deposed("a write was refused: another control plane leads");
    return;
  } else {
    ++failures_;
    failing_ = true;
    held_ = true;
    blocked_ = true;
    // Its keys are written again by the next write, with what memory holds then.
    Written again = std::move(group);
    again.add(unsaved_);
    unsaved_ = std::move(again);
    if (mono_us() - failure_logged_us_ > 10'000'000) {
      log_error("etcd did not take the control plane's writes; replies and commands wait",
                {{"ERROR", st.error().str()}});
      failure_logged_us_ = mono_us();
    }
    retry_later();
  }
  if (seal_waiting_) commit_soon();
}

void GroupCommit::commit() {
  if (store_.async_commits()) store_.drain();  // every group in flight, answered
  if (!store_.in_batch()) return;
  uint64_t t0 = mono_us();
  Status committed = store_.commit_batch();
  uint64_t took = mono_us() - t0;
  seconds_.observe(static_cast<double>(took) / 1e6);
  if (committed.ok()) {
    group_ = {};
    failing_ = false;
    if (blocked_ && !std::exchange(covers_rewrite_, false)) return;  // still held
    blocked_ = false;
    bool ended_hold = std::exchange(held_, false);
    if (hooks_.committed) hooks_.committed(took, ended_hold);
    gate_.release();
    return;
  }
  if (store_.fenced_out()) {
    // Deposed: what this group holds must never be sent (another leader acts now).
    store_.abandon_batch();
    group_ = {};
    hooks_.deposed("a write was refused: another control plane leads");
    return;
  }
  failed(committed);
  // A replicated store's group holds its output until it commits; the local disk's
  // replies go out (the machines' calls are answered from memory; operators' calls,
  // which commit on their own, are refused while the disk refuses).
  if (!opts_.replicated) gate_.release();
}

Status GroupCommit::ready_for_change() {
  commit();
  if (store_.in_batch()) return make_error("the state store's group did not commit");
  Status probe = store_.probe_write();
  if (!probe.ok()) {
    ++failures_;
    failing_ = true;
    Error e = probe.error();
    return std::move(e)
        .wrap("the control plane's state store takes no writes now, so no change is accepted")
        .with_code(rpc::kUnavailable);
  }
  return {};
}

void GroupCommit::failed(const Status& why) {
  ++failures_;
  failing_ = true;
  if (opts_.replicated) held_ = true;
  store_.abandon_batch();
  // Nothing of the group is lost from memory: all of it is written again by the next
  // write, older than what waits already.
  Written again = std::move(group_);
  again.add(unsaved_);
  unsaved_ = std::move(again);
  group_ = {};
  if (mono_us() - failure_logged_us_ > 10'000'000) {
    log_error(opts_.replicated
                  ? "etcd did not take the control plane's writes; replies and commands wait"
                  : "cannot commit the control plane's state; kept in memory, written again "
                    "when the disk takes it",
              {{"ERROR", why.error().str()}});
    failure_logged_us_ = mono_us();
  }
  retry_later();
}

void GroupCommit::retry_later() {
  if (!retry_.active() || !retry_armed_) {
    retry_armed_ = true;
    auto t = loop_.add_timer_in(opts_.retry_us, [this] {
      retry_armed_ = false;
      if (!hooks_.rewrite()) return;
      commit_soon();
    });
    if (t.ok()) retry_ = std::move(t).value();
  }
}

}  // namespace weft::cp
