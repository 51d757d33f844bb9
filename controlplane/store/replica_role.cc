#include "controlplane/store/replica_role.h"

#include "common/clock.h"
#include "common/log.h"

namespace weft::cp {

Status ReplicaRole::start(LeaderConfig cfg) {
  key_ = cfg.key;
  TRY_ASSIGN(leadership_, Leadership::start(std::move(cfg)));
  watch();
  return {};
}

void ReplicaRole::watch() {
  auto t = loop_.add_timer_in(50'000, [this] {
    check();
    if (!stepped_down_) watch();
  });
  if (t.ok()) timer_ = std::move(t).value();
}

void ReplicaRole::check() {
  if (stepped_down_) return;
  if (leadership_->lost()) return step_down(leadership_->lost_reason());
  if (etcd_ && etcd_->fenced_out())
    return step_down("a write was refused: another control plane leads");
  if (leading_) return;
  hint_ = leadership_->leader();
  if (!leadership_->leading()) return;
  // Won: the state is read now, not before (the previous leader wrote until its end).
  if (etcd_) etcd_->fence(key_, leadership_->revision());
  uint64_t t0 = now_monotonic_us();
  if (auto s = hooks_.restore(); !s.ok())
    return step_down("cannot read the state from etcd: " + s.error().str());
  leading_ = true;
  hint_.clear();
  hooks_.lead();
  log_info("this control plane leads now",
           {{"RESTORE_MS", std::to_string((now_monotonic_us() - t0) / 1000)}});
}

void ReplicaRole::step_down(const std::string& why) {
  stepped_down_ = true;
  // Nothing held is sent (the group was not written): the machines hear it from the
  // next leader. The process ends; systemd starts it again as a follower.
  log_error("this control plane no longer leads; stopping", {{"REASON", why}});
  loop_.exit(3);
}

}  // namespace weft::cp
