// Thin C++ ownership over sd-event. One EventLoop per daemon, one thread.
//
// Every add_* returns a Source that owns the sd-event source and the callback; dropping
// the Source disables and frees both. Callbacks run on the loop's thread and must not
// block for long. A callback may destroy its own Source.
#pragma once

#include <systemd/sd-event.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/result.h"

namespace weft {

class Source {
 public:
  Source() = default;
  Source(Source&&) noexcept = default;
  Source& operator=(Source&&) noexcept = default;
  ~Source();
  bool active() const { return impl_ != nullptr; }
  // For io sources: changes the epoll events watched (e.g. add EPOLLOUT while output
  // is queued).
  Status set_io_events(uint32_t events);
  // sd-event priority: lower runs first (0 by default); SD_EVENT_PRIORITY_IDLE runs only
  // when nothing else is pending.
  Status set_priority(int64_t priority);
  void reset() { impl_.reset(); }

  struct Impl;
  explicit Source(std::unique_ptr<Impl> impl);

 private:
  struct Deleter {
    void operator()(Impl* p) const;
  };
  std::unique_ptr<Impl, Deleter> impl_;
};

class EventLoop {
 public:
  using IoFn = std::function<void(uint32_t revents)>;
  using Fn = std::function<void()>;

  static Result<std::unique_ptr<EventLoop>> create();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  sd_event* get() const { return ev_; }

  Result<Source> add_io(int fd, uint32_t events, IoFn fn);
  // One-shot timer at an absolute CLOCK_MONOTONIC time in microseconds.
  Result<Source> add_timer_at(uint64_t usec_monotonic, Fn fn);
  Result<Source> add_timer_in(uint64_t usec_from_now, Fn fn);
  // Blocks the signal in this thread and delivers it through the loop.
  Result<Source> add_signal(int sig, Fn fn);
  Result<Source> add_defer(Fn fn);
  // Runs fn on the next iteration unless `slot` already holds a pending run (calls in
  // between coalesce into it); at once when no defer can be added. `slot` must outlive
  // the run or be reset first.
  void defer_once(Source& slot, Fn fn);

  // SIGTERM and SIGINT end run() with exit code 0, after on_exit (if any) has run. The
  // loop owns these sources.
  Status exit_on_termination(Fn on_exit = {});
  // Sends WATCHDOG=1 automatically when $WATCHDOG_USEC asks for it.
  void enable_watchdog();
  Status run();
  // Runs one iteration, waiting at most timeout_us. For tests.
  Status run_once(uint64_t timeout_us);
  void exit(int code = 0);

 private:
  explicit EventLoop(sd_event* ev) : ev_(ev) {}
  sd_event* ev_;
  std::vector<Source> owned_;  // sources the loop keeps for itself (termination signals)
};

}  // namespace weft
