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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
};

// PSI: /proc/pressure/{cpu,memory,io}. "some" avg10 above degraded_pct is DEGRADED,
// "full" avg10 (or "some" for cpu, which has no meaningful full) above failed_pct FAILED.
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
  void observe(const KmsgRecord& r, uint64_t now_us);
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
// `flap_limit` carrier changes in the window is DEGRADED.
std::unique_ptr<Probe> make_link_probe(HostPaths host, std::string ifname, int flap_limit = 3,
                                       uint64_t window_us = 300'000'000);

// An operator's script: exit 0/1/2 = ok/degraded/failed, anything else or a timeout is
// FAILED (the script is killed). The first line of its output becomes the detail.
std::unique_ptr<Probe> make_exec_probe(std::string name, std::vector<std::string> argv,
                                       uint64_t timeout_us);

}  // namespace weft::hcs
