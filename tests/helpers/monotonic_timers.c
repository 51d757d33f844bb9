// Preloaded before libfaketime into the daemons whose wall clock a test steps
// (tests/cluster_harness.cc). libfaketime's timerfd_settime takes every absolute timer
// for one on the faked wall clock and moves it by the clock's offset, also a timer on
// CLOCK_MONOTONIC, which FAKETIME_DONT_FAKE_MONOTONIC otherwise leaves true: a step
// forward by more than the machine's uptime makes sd-event's next timer negative (EINVAL,
// and the daemon's loop ends), a step back makes every timer fire that much later. No
// daemon of weft arms a timer on the wall clock (common/event.cc: all are monotonic), so
// this passes timerfd_settime to the kernel as it is, and the step is one of the wall
// clock alone, as on a real machine.
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

int timerfd_settime(int fd, int flags, const struct itimerspec* new_value,
                    struct itimerspec* old_value) {
  return (int)syscall(SYS_timerfd_settime, fd, flags, new_value, old_value);
}

int timerfd_gettime(int fd, struct itimerspec* curr_value) {
  return (int)syscall(SYS_timerfd_gettime, fd, curr_value);
}
