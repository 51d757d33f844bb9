// Kernel event probes: OOM kills (memory-cgroup victim or machine-wide OOM), TCP
// retransmissions and dropped packets. Each loads an eBPF program (CO-RE, BTF-typed
// tracepoints, built with the project) and falls back to procfs counters when BPF cannot
// load (no BTF, an old kernel, no CAP_BPF, built without BPF); every sample says which
// source it used in metrics.source. See docs/health.md.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/paths.h"
#include "hcs/kmsg.h"
#include "hcs/probes.h"

namespace weft::hcs {

struct KernelProbeConfig {
  bool bpf = true;                       // false: always the procfs fallback
  uint64_t oom_window_us = 600'000'000;  // machine-wide OOM kills are judged over this
  int oom_global_failed = 5;             // this many machine-wide kills in the window: FAILED
  int memcg_oom_storm_per_min = 1000;    // memcg kills a minute (last 60 s or 10 s x 6): DEGRADED
  double tcp_retrans_degraded_per_s = 1000;
  double drops_degraded_per_s = 20000;
};

// Named counters from /proc/net/snmp and /proc/net/netstat ("Tcp" "RetransSegs"), whose
// lines come in header/value pairs, and from /proc/vmstat ("oom_kill 3").
std::optional<uint64_t> snmp_counter(const std::string& text, const std::string& group,
                                     const std::string& name);
std::optional<uint64_t> vmstat_counter(const std::string& text, const std::string& name);

struct OomKill {
  uint64_t at_us = 0;
  uint32_t pid = 0;
  bool memcg = false;
  std::string comm, cgroup;
};

class OomProbe : public Probe {
 public:
  OomProbe(HostPaths host, KernelProbeConfig cfg);
  ~OomProbe() override;
  std::string name() const override { return "oom"; }
  // Loads the BPF program and watches its ring buffer on `loop`; `on_kill` runs after
  // each batch of kills (the manager re-samples the probe when the verdict may change).
  // Falls back to /proc/vmstat when BPF cannot load; returns the source used.
  std::string attach(EventLoop& loop, std::function<void()> on_kill);
  const std::string& source() const { return source_; }
  // Kernel-log OOM events: in procfs mode they tell memcg kills from machine-wide ones.
  void observe_kmsg(KernelEvent e, uint64_t now_us);
  void record(const OomKill& k);  // one kill (from BPF, or a test)
  Sample run(uint64_t now_us) override;
  // Kills in [now - window, now]: {memcg, global}.
  std::pair<int, int> counts(uint64_t now_us, uint64_t window_us) const;
  uint64_t total() const { return total_; }

 private:
  struct Impl;
  void drain();
  HostPaths host_;
  KernelProbeConfig cfg_;
  std::string source_ = "none";
  std::unique_ptr<Impl> impl_;
  Source rb_src_;
  std::function<void()> on_kill_;
  std::deque<std::pair<uint64_t, bool>> kills_;  // (time, memcg)
  std::deque<OomKill> recent_;                   // the last few victims, for operators
  std::optional<uint64_t> vmstat_last_;
  uint64_t kmsg_seen_ = 0, total_ = 0;
};

// A counter-rate probe: TCP retransmits or dropped packets per second between samples.
class RateProbe : public Probe {
 public:
  enum class Kind { kTcpRetransmits, kNetDrops };
  RateProbe(Kind kind, HostPaths host, KernelProbeConfig cfg);
  ~RateProbe() override;
  std::string name() const override;
  std::string attach();  // loads BPF or settles on procfs; returns the source
  const std::string& source() const { return source_; }
  Sample run(uint64_t now_us) override;

 private:
  struct Impl;
  // Current totals: "total" plus, for drops from BPF, one entry per reason.
  std::optional<std::map<std::string, uint64_t>> read_counters();
  Kind kind_;
  HostPaths host_;
  KernelProbeConfig cfg_;
  std::string source_ = "none";
  std::unique_ptr<Impl> impl_;
  std::optional<std::map<std::string, uint64_t>> last_;
  uint64_t last_us_ = 0;
};

}  // namespace weft::hcs
