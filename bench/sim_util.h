// Shared by the benchmarks that drive a real weft-controlplane with simulated machines
// (reconnect_bench, fleet_sim): certificates for thousands of machines, the control
// plane's CPU and memory from /proc, starting it, and running a loop until a condition.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

#include "common/clock.h"
#include "common/event.h"
#include "common/fs.h"

namespace weft::bench {

// The simulated machines' ids: m00000, m00001, ...
std::string machine_name(int index);
// Certificates for machines 0..n-1 (CN and SAN DNS = machine_name(i), OU=machine) signed
// in-process by the CA in `pki` (its ca.pem and ca.key, as weft-pki makes them); each
// as <pki>/<name>.pem and .key. Far faster than n runs of the openssl CLI.
bool issue_machine_certs(const std::string& pki, int n);
// utime + stime of a process, in seconds; and its resident set, in KiB.
double cpu_seconds(pid_t pid);
long rss_kib(pid_t pid);
// weft-controlplane -c conf, its output appended to log.
pid_t start_controlplane(const std::string& conf, const std::string& log);
// Waits until the control plane's Unix socket answers (or ~10 s pass).
bool wait_controlplane(const std::string& socket);
// Raises RLIMIT_NOFILE (soft and, as root, hard) to at least `want`; false if it cannot.
bool raise_nofile(uint64_t want);

// A simulated daemon's connection to the control plane: a non-blocking TCP connect from
// its machine's own source address to 127.0.0.1:port. `done` runs once, from a later
// loop iteration, with the connected socket, or with an invalid Fd when the connect
// failed. Dropping the Dialer (or cancel()) abandons the attempt; done is not called.
class Dialer {
 public:
  Dialer() = default;
  Dialer(const Dialer&) = delete;  // its callbacks hold its address
  Dialer& operator=(const Dialer&) = delete;
  void dial(EventLoop& loop, in_addr source, uint16_t port, std::function<void(Fd)> done);
  void cancel();
  bool dialing() const { return done_ != nullptr; }

 private:
  void finish(EventLoop& loop, Fd fd);
  Fd fd_;
  Source io_, later_;
  std::function<void(Fd)> done_;
};

// Runs the loop until pred() or the timeout; the seconds it took (or -1 on timeout).
// `each` (optional) runs after every loop iteration.
template <class Pred, class Each>
double run_until(EventLoop& loop, Pred pred, double timeout_s, Each each) {
  uint64_t start = now_monotonic_us();
  while (!pred()) {
    if (now_monotonic_us() - start > static_cast<uint64_t>(timeout_s * 1e6)) return -1;
    (void)loop.run_once(20'000);
    each();
  }
  return static_cast<double>(now_monotonic_us() - start) / 1e6;
}
template <class Pred>
double run_until(EventLoop& loop, Pred pred, double timeout_s) {
  return run_until(loop, pred, timeout_s, [] {});
}

}  // namespace weft::bench
