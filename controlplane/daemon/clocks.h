// The leader's clocks: the tick every heartbeat interval (and soon after a change that
// asks for one: kick), the dead-machine watch every quarter interval, and the
// maintenance round every second (and soon after a change). What each round does is the
// Manager's; when it runs is this class's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "common/event.h"

namespace weft::cp {

class Clocks {
 public:
  struct Hooks {
    std::function<void()> tick;
    std::function<void(double seconds)> ticked;  // how long a periodic tick took
    std::function<void()> watch;                 // the dead-machine check
    std::function<void()> maintenance;
  };
  Clocks(EventLoop& loop, uint64_t interval_us, Hooks hooks)
      : loop_(loop), interval_us_(interval_us), hooks_(std::move(hooks)) {}
  // Every round from now on (the leader's start).
  void start();
  // A tick soon (next loop iteration), once however many changes ask for it.
  void kick();
  // The maintenance round soon, and every second from then.
  void maintenance_soon();
  // A look at the machines' heartbeats at `now`: how long since the previous look when
  // that is more than an interval (this loop was held up: a slow etcd write, the process
  // paused), so that the time is not counted against the machines.
  std::optional<uint64_t> held_up(uint64_t now);

 private:
  void periodic();
  void watch();
  void maintenance();
  EventLoop& loop_;
  uint64_t interval_us_;
  Hooks hooks_;
  Source tick_, watch_, kick_, maintenance_;
  bool kicked_ = false;
  uint64_t last_look_us_ = 0;
};

}  // namespace weft::cp
