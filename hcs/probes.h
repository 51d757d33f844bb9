// Health probes. Each one takes a sample of one aspect of the machine and returns a
// Health with a human detail and its raw figures; hysteresis is the verdict engine's
// job (verdict.h), not the probe's. Every path goes through HostPaths, so the tests run
// the same code against fake /proc and /sys trees.
#pragma once

#include <sys/statvfs.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/fs.h"
#include "common/paths.h"
#include "hcs/kmsg.h"
#include "hcs/verdict.h"

namespace weft::hcs {

struct Sample {
  Health health = Health::kUnknown;
  std::string detail;
  nlohmann::json metrics = nlohmann::json::object();
};

class Probe {
 public:
  virtual ~Probe() = default;
  virtual std::string name() const = 0;
  virtual Sample run(uint64_t now_us) = 0;
  // Takes a sample on the event loop and calls done() with it, now or later. Probes that
  // wait on something outside (an operator's script) override it to run off the loop;
  // the default samples at once.
  virtual void start(EventLoop& loop, uint64_t now_us, std::function<void(Sample)> done) {
    (void)loop;
    done(run(now_us));
  }
};

// PSI: /proc/pressure/{cpu,memory,io}. "some" avg10 above degraded_pct is DEGRADED,
// "full" avg10 (or "some" for cpu, which has no meaningful full) above failed_pct FAILED.
// With a kernel PSI trigger armed, a stall burst is seen as it happens: the trigger's fd
// polls POLLPRI and the manager samples the probe at once; a trigger within the last two
// windows makes the sample at least DEGRADED even before avg10 catches up.
class PsiProbe : public Probe {
 public:
  static constexpr uint64_t kTriggerWindowUs = 2'000'000;  // unprivileged triggers need 2 s
  PsiProbe(HostPaths host, std::string resource, double degraded_pct, double failed_pct)
      : host_(std::move(host)), res_(std::move(resource)), deg_(degraded_pct), fail_(failed_pct) {}
  std::string name() const override { return "psi-" + res_; }
  Sample run(uint64_t now_us) override;
  // Opens the pressure file and writes a "some" trigger for degraded_pct of the window.
  Result<Fd> arm_trigger();
  // A trigger fired: checks it against the stall total the kernel reports (kernels have
  // fired unprivileged triggers spuriously right after arming) and records it when real.
  // Returns whether it counted.
  bool triggered(uint64_t now_us);

 private:
  uint64_t stall_threshold_us() const;
  // Reads the "some" total (µs of stall since boot) and remembers when.
  std::optional<uint64_t> read_some_total();
  HostPaths host_;
  std::string res_;
  double deg_, fail_;
  uint64_t last_trigger_us_ = 0, triggers_ = 0, spurious_ = 0;
  void remember_total(uint64_t total);
  // Recent "some" totals (monotonic µs, total µs), a few windows' worth.
  std::deque<std::pair<uint64_t, uint64_t>> totals_;
  uint64_t armed_at_ = 0;
};
std::unique_ptr<Probe> make_psi_probe(HostPaths host, std::string resource, double degraded_pct,
                                      double failed_pct);

// A filesystem: free space and inodes (percent), and whether it is still mounted
// read-write (a read-only remount after errors is FAILED).
using StatFs = std::function<int(const std::string& path, struct statvfs* out)>;
std::unique_ptr<Probe> make_disk_probe(HostPaths host, std::string mount_point, double min_free_pct,
                                       double min_inodes_pct, StatFs statfs = nullptr);

// Kernel log events in sliding windows. Feed records with observe(); run() judges the
// window: a global OOM kill or a hung task is DEGRADED, repeated I/O or filesystem errors
// or an oops FAILED; a machine check is FAILED and stays so (latched) until clear().
class KmsgProbe : public Probe {
 public:
  explicit KmsgProbe(uint64_t window_us = 600'000'000, int io_errors_failed = 5)
      : window_us_(window_us), io_errors_failed_(io_errors_failed) {}
  std::string name() const override { return "kernel-log"; }
  // Classifies and counts one record; returns what it was.
  KernelEvent observe(const KmsgRecord& r, uint64_t now_us);
  Sample run(uint64_t now_us) override;
  void clear_latch() { latched_.clear(); }
  std::map<std::string, int> counts(uint64_t now_us);

 private:
  KmsgClassifier classifier_;
  std::deque<std::pair<uint64_t, KernelEvent>> events_;
  std::string latched_;
  uint64_t window_us_;
  int io_errors_failed_;
};

// A network link's carrier (/sys/class/net/<if>/carrier): down is FAILED; more than
// `flap_limit` carrier changes in the window is DEGRADED. rtnetlink events (event()) count
// every change as it happens, so flaps shorter than the probe interval are not missed.
class LinkProbe : public Probe {
 public:
  LinkProbe(HostPaths host, std::string ifname, int flap_limit = 3,
            uint64_t window_us = 300'000'000)
      : host_(std::move(host)),
        if_(std::move(ifname)),
        flap_limit_(flap_limit),
        window_(window_us) {}
  std::string name() const override { return "link:" + if_; }
  const std::string& ifname() const { return if_; }
  Sample run(uint64_t now_us) override;
  void event(bool carrier, uint64_t now_us) { note(carrier, now_us); }

 private:
  void note(bool up, uint64_t now_us);
  HostPaths host_;
  std::string if_;
  int flap_limit_;
  uint64_t window_;
  std::optional<bool> last_;
  std::deque<uint64_t> changes_;
};
std::unique_ptr<Probe> make_link_probe(HostPaths host, std::string ifname, int flap_limit = 3,
                                       uint64_t window_us = 300'000'000);

// Liveness of a weft daemon through its socket: connect and call `method` within
// `timeout_ms`. No socket, a refused connection, an error or a timeout is FAILED; an
// answer slower than half the timeout is DEGRADED.
std::unique_ptr<Probe> make_socket_probe(std::string name, std::string socket, std::string method,
                                         int timeout_ms);

// An operator's script: exit 0/1/2 = ok/degraded/failed, anything else or a timeout is
// FAILED (the script is killed). The first line of its output becomes the detail.
std::unique_ptr<Probe> make_exec_probe(std::string name, std::vector<std::string> argv,
                                       uint64_t timeout_us);

}  // namespace weft::hcs
