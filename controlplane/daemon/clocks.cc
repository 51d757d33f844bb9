#include "controlplane/daemon/clocks.h"

#include "common/clock.h"

namespace weft::cp {

void Clocks::start() {
  auto t = loop_.add_timer_in(interval_us_, [this] { periodic(); });
  if (t.ok()) tick_ = std::move(t).value();
  watch();
  maintenance();
}

void Clocks::periodic() {
  uint64_t t0 = now_monotonic_us();
  hooks_.tick();
  hooks_.ticked(static_cast<double>(now_monotonic_us() - t0) / 1e6);
  auto t = loop_.add_timer_in(interval_us_, [this] { periodic(); });
  if (t.ok()) tick_ = std::move(t).value();
}

void Clocks::watch() {
  // Between ticks: a machine is declared dead within a quarter of a heartbeat interval
  // of its deadline, not up to a whole interval later.
  hooks_.watch();
  auto t = loop_.add_timer_in(interval_us_ / 4, [this] { watch(); });
  if (t.ok()) watch_ = std::move(t).value();
}

void Clocks::kick() {
  if (kick_.active() && kicked_) return;  // one tick for every change of this iteration
  kicked_ = true;
  auto d = loop_.add_defer([this] {
    kicked_ = false;
    hooks_.tick();
  });
  if (d.ok()) kick_ = std::move(d).value();
}

void Clocks::maintenance() {
  maintenance_.reset();
  hooks_.maintenance();
  auto t = loop_.add_timer_in(1'000'000, [this] { maintenance(); });
  if (t.ok()) maintenance_ = std::move(t).value();
}

void Clocks::maintenance_soon() {
  auto soon = loop_.add_defer([this] { maintenance(); });
  if (soon.ok()) maintenance_ = std::move(soon).value();
}

std::optional<uint64_t> Clocks::held_up(uint64_t now) {
  std::optional<uint64_t> held;
  if (last_look_us_ && now > last_look_us_ && now - last_look_us_ > interval_us_)
    held = now - last_look_us_;
  last_look_us_ = now;
  return held;
}

}  // namespace weft::cp
