#include "common/event.h"

#include <signal.h>
#include <time.h>

#include "common/clock.h"
#include "common/fs.h"

namespace weft {

struct Source::Impl {
  sd_event_source* src = nullptr;
  EventLoop::IoFn io;
  EventLoop::Fn fn;
};

Source::Source(std::unique_ptr<Impl> impl) : impl_(impl.release()) {}
Source::~Source() = default;

Status Source::set_priority(int64_t priority) {
  if (!impl_) return make_error("no event source");
  int r = sd_event_source_set_priority(impl_->src, priority);
  if (r < 0) return errno_error(-r, "sd_event_source_set_priority");
  return {};
}

Status Source::set_io_events(uint32_t events) {
  if (!impl_) return make_error("inactive event source");
  int r = sd_event_source_set_io_events(impl_->src, events);
  if (r < 0) return errno_error(-r, "sd_event_source_set_io_events");
  return {};
}

void Source::Deleter::operator()(Impl* p) const {
  if (p->src) sd_event_source_disable_unref(p->src);
  delete p;
}

namespace {

int on_io(sd_event_source*, int, uint32_t revents, void* ud) {
  auto* impl = static_cast<Source::Impl*>(ud);
  auto fn = impl->io;  // the callback may destroy impl
  fn(revents);
  return 0;
}

int on_time(sd_event_source*, uint64_t, void* ud) {
  auto* impl = static_cast<Source::Impl*>(ud);
  auto fn = impl->fn;
  fn();
  return 0;
}

int on_signal(sd_event_source*, const struct signalfd_siginfo*, void* ud) {
  auto* impl = static_cast<Source::Impl*>(ud);
  auto fn = impl->fn;
  fn();
  return 0;
}

int on_defer(sd_event_source*, void* ud) {
  auto* impl = static_cast<Source::Impl*>(ud);
  auto fn = impl->fn;
  fn();
  return 0;
}

}  // namespace

Result<std::unique_ptr<EventLoop>> EventLoop::create() {
  sd_event* ev = nullptr;
  int r = sd_event_new(&ev);
  if (r < 0) return errno_error(-r, "sd_event_new");
  return std::unique_ptr<EventLoop>(new EventLoop(ev));
}

EventLoop::~EventLoop() {
  owned_.clear();
  sd_event_unref(ev_);
}

Status EventLoop::exit_on_termination(Fn on_exit) {
  for (int sig : {SIGTERM, SIGINT}) {
    TRY_ASSIGN(Source s, add_signal(sig, [this, on_exit] {
                 if (on_exit) on_exit();
                 exit(0);
               }));
    owned_.push_back(std::move(s));
  }
  return {};
}

Result<Source> EventLoop::add_io(int fd, uint32_t events, IoFn fn) {
  auto impl = std::make_unique<Source::Impl>();
  impl->io = std::move(fn);
  int r = sd_event_add_io(ev_, &impl->src, fd, events, on_io, impl.get());
  if (r < 0) return errno_error(-r, "sd_event_add_io");
  return Source(std::move(impl));
}

Result<Source> EventLoop::add_timer_at(uint64_t usec, Fn fn) {
  auto impl = std::make_unique<Source::Impl>();
  impl->fn = std::move(fn);
  int r = sd_event_add_time(ev_, &impl->src, CLOCK_MONOTONIC, usec, 1000, on_time, impl.get());
  if (r < 0) return errno_error(-r, "sd_event_add_time");
  return Source(std::move(impl));
}

Result<Source> EventLoop::add_timer_in(uint64_t usec_from_now, Fn fn) {
  return add_timer_at(now_monotonic_us() + usec_from_now, std::move(fn));
}

Result<Source> EventLoop::add_signal(int sig, Fn fn) {
  sigset_t ss;
  sigemptyset(&ss);
  sigaddset(&ss, sig);
  sigprocmask(SIG_BLOCK, &ss, nullptr);
  auto impl = std::make_unique<Source::Impl>();
  impl->fn = std::move(fn);
  int r = sd_event_add_signal(ev_, &impl->src, sig, on_signal, impl.get());
  if (r < 0) return errno_error(-r, "sd_event_add_signal");
  return Source(std::move(impl));
}

Result<Source> EventLoop::add_defer(Fn fn) {
  auto impl = std::make_unique<Source::Impl>();
  impl->fn = std::move(fn);
  int r = sd_event_add_defer(ev_, &impl->src, on_defer, impl.get());
  if (r < 0) return errno_error(-r, "sd_event_add_defer");
  sd_event_source_set_enabled(impl->src, SD_EVENT_ONESHOT);
  return Source(std::move(impl));
}

void EventLoop::defer_once(Source& slot, Fn fn) {
  if (slot.active()) return;
  // (on_defer copies the callback before it runs: resetting `slot` inside is safe.)
  auto d = add_defer([&slot, fn] {
    slot.reset();
    fn();
  });
  if (d.ok())
    slot = std::move(d).value();
  else
    fn();
}

void EventLoop::enable_watchdog() {
  sd_event_set_watchdog(ev_, 1);
}

Status EventLoop::run() {
  int r = sd_event_loop(ev_);
  if (r < 0) return errno_error(-r, "event loop");
  return {};
}

Status EventLoop::run_once(uint64_t timeout_us) {
  int r = sd_event_run(ev_, timeout_us);
  if (r < 0) return errno_error(-r, "event loop iteration");
  return {};
}

void EventLoop::exit(int code) {
  sd_event_exit(ev_, code);
}

}  // namespace weft
