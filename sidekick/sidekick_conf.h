// weft-sidekick configuration (/etc/weft/sidekick.toml). See docs/configuration.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cp_link.h"
#include "common/result.h"

namespace weft::sidekick {

struct SidekickConfig {
  std::string socket = "/run/weft/sidekick.sock";
  std::string socket_group = "weft";
  std::string state_dir = "/var/lib/weft/sidekick";
  // First match wins: operators' overrides before the shipped profiles.
  std::vector<std::string> profile_dirs = {"/etc/weft/profiles.d", "/usr/share/weft/profiles"};
  // Where `cgroup` knobs enable or disable controllers: an absolute cgroup directory or
  // "systemd:<path below the cgroup2 mount>".
  // The agent's tasks/ cgroup: its subtree_control decides the controllers every task gets.
  std::string workload_cgroup = "systemd:system.slice/weft-tasks.service/tasks";
  std::string host_root = "/";
  uint64_t verify_interval_us = 60'000'000;
  bool enforce_drift = false;  // drift_policy = "enforce" re-applies; "report" only reports
  bool apply_on_start = true;  // re-apply the last committed profile at start (boot)
  std::string log_level = "info";
  // Prometheus /metrics (docs/metrics.md): loopback by default; "" = none.
  std::string metrics_listen = "127.0.0.1:9472";
  // weft-controlplane's endpoint ("" = none): the machine's desired profile comes from
  // there, and the applied one is reported there.
  std::string control_plane;
  // A TCP control_plane is unauthenticated until TLS: allowed only when this is set.
  bool insecure_control_plane = false;
  ControlPlaneTls control_plane_tls;  // control_plane_tls_* and control_plane_name
  std::string machine_id;             // empty: /etc/machine-id (as weft-agent)
  // Planned maintenance may reboot this machine (machine.reboot from the control plane,
  // through systemd's reboot.target). Off by default: the operator opts a fleet in.
  bool allow_reboot = false;
};

Result<SidekickConfig> parse_sidekick_config(const std::string& text, const std::string& name);
Result<SidekickConfig> load_sidekick_config(const std::string& path);
// Resolves "systemd:" paths against the cgroup2 mount.
Status resolve_sidekick_config(SidekickConfig* cfg);

}  // namespace weft::sidekick
