// weft-hcs configuration (/etc/weft/hcs.toml). See docs/health.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cp_link.h"
#include "common/result.h"
#include "hcs/kernel_probes.h"
#include "hcs/verdict.h"

namespace weft::hcs {

struct DiskCheck {
  std::string path;
  double min_free_pct = 10, min_inodes_pct = 5;
};
struct ExecCheck {
  std::string name;
  std::vector<std::string> command;
  uint64_t timeout_us = 10'000'000;
};

struct HcsConfig {
  std::string socket = "/run/weft/hcs.sock";
  std::string socket_group = "weft";
  std::string state_dir = "/var/lib/weft/hcs";
  std::string host_root = "/";
  uint64_t interval_us = 5'000'000;
  // A sample worse than the probe's state is confirmed by re-sampling at this pace, so
  // fail_after consecutive samples take seconds, not fail_after intervals.
  uint64_t confirm_interval_us = 1'000'000;
  bool kmsg = true;
  bool psi_triggers = true;
  // The resources whose pressure is probed (a batch fleet that keeps its CPUs saturated on
  // purpose leaves "cpu" out).
  std::vector<std::string> psi = {"cpu", "memory", "io"};
  KernelProbeConfig kernel;
  // Liveness of the other weft daemons; an empty path disables the probe.
  std::string agent_socket = "/run/weft/agent.sock";
  std::string sidekick_socket = "/run/weft/sidekick.sock";
  int liveness_timeout_ms = 2000;
  double psi_degraded_pct = 20, psi_failed_pct = 50;
  std::vector<DiskCheck> disks = {{"/", 10, 5}};
  std::vector<std::string> links;
  std::vector<ExecCheck> execs;
  Hysteresis hysteresis;
  std::string log_level = "info";
  // Prometheus /metrics (docs/metrics.md): loopback by default; "" = none.
  std::string metrics_listen = "127.0.0.1:9473";
  // weft-controlplane's endpoint ("" = none): the machine verdict is reported there on
  // every change and every heartbeat interval.
  std::string control_plane;
  // A TCP control_plane is unauthenticated until TLS: allowed only when this is set.
  bool insecure_control_plane = false;
  ControlPlaneTls control_plane_tls;  // control_plane_tls_* and control_plane_name
  std::string machine_id;             // empty: /etc/machine-id (as weft-agent)
};

Result<HcsConfig> parse_hcs_config(const std::string& text, const std::string& name);
Result<HcsConfig> load_hcs_config(const std::string& path);

}  // namespace weft::hcs
