// weft-agent configuration (/etc/weft/agent.toml). See docs/configuration.md.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "common/cp_link.h"
#include "common/paths.h"
#include "common/registry.h"
#include "common/result.h"

namespace weft::agent {

struct AgentConfig {
  std::string socket = "/run/weft/agent.sock";
  std::string socket_group = "weft";  // group allowed to use the socket and mutate
  std::string state_dir = "/var/lib/weft/agent";
  // Empty: under systemd, the agent's own (delegated) cgroup; otherwise
  // <cgroup2 mount>/weft. "systemd:<path>" means <cgroup2 mount>/<path>, e.g.
  // "systemd:system.slice/weft-tasks.service" (the packaged default).
  std::string cgroup_root;
  // Resolved: whether the agent moves itself into <cgroup_root>/agent (it does unless
  // systemd runs it in a cgroup of its own outside the root).
  bool agent_in_root = true;
  std::string machine_id;  // empty: /etc/machine-id
  std::map<std::string, std::string> labels;
  std::string control_plane;  // endpoint; used once the control plane exists
  // A TCP control_plane is unauthenticated until TLS: allowed only when this is set.
  bool insecure_control_plane = false;
  ControlPlaneTls control_plane_tls;  // control_plane_tls_* and control_plane_name
  // The user a task runs as when its spec (or image) names none. Unset: a uid and gid of
  // the task's own from `task_uids`, shared with no other task and no host user. A name:
  // that user (shared by every such task); "": the agent's own user (root).
  std::optional<std::string> default_task_user;
  // The range tasks' own uids (and gids, the same numbers) are taken from: no host user
  // or group may have one of them. Taken in turn, so a freed uid is reused last.
  long task_uid_first = 3000000, task_uid_last = 3065535;
  // Whether a task may run as uid 0 or with gid 0 (its spec's user/group, or the
  // default). Root in a task is still confined (capabilities, seccomp, masked /proc),
  // but whoever may run tasks then holds root-equivalent power over the task's files.
  bool allow_root_tasks = false;
  // Whether a spec may ask for seccomp = "unconfined".
  bool allow_unconfined_tasks = false;
  // Every task's output also goes to journald, one entry per line with WEFT_TASK,
  // WEFT_TASK_ID, WEFT_JOB, WEFT_ENTITLEMENT and WEFT_STREAM (docs/logs.md): an existing
  // log shipper picks it up. The files stay (weftctl task logs reads them).
  bool log_journald = false;
  std::string journald_socket = "/run/systemd/journal/socket";  // journald's native socket
  std::string init_path;        // empty: weft-init next to weft-agent, else libexec
  std::string host_root = "/";  // tests: a fake /proc and /sys tree
  std::string log_level = "info";
  // Prometheus /metrics (docs/metrics.md): loopback by default; "" = none.
  std::string metrics_listen = "127.0.0.1:9471";
  // [images] (docs/images.md): registries, and the image cache's size limit.
  registry::Config registry;
  uint64_t image_cache_max = uint64_t{20} << 30;
  // Free space on the state disk that image downloads and unpacks never take.
  uint64_t image_reserve = uint64_t{1} << 30;
  // [volumes] allowed_host_paths: the host directories (and what is under them) a task's
  // bind mounts may name. Empty: none.
  std::vector<std::string> volume_host_paths;
  // Service discovery (docs/services.md). The ports the control plane hands out to jobs'
  // `ports = { name = 0 }` on this machine, and that a local task's 0 port takes.
  uint16_t port_first = 20000, port_last = 32767;
  // Where this agent answers DNS for the weft. zone from its copy of the endpoints
  // ("host:port" on UDP; "" = it does not, and keeps no copy); the TTL of its answers.
  std::string dns_listen;
  uint32_t dns_ttl_s = 1;
  // Which jobs the control plane tells it of: those its DNS clients ask for (false, the
  // default: a query for a job not asked about before waits while the agent asks), or
  // every job of the region (true: dns_services = "all").
  bool dns_all_services = false;
  // How often each task's cgroup is sampled for task.usage (docs/protocol.md): CPU and
  // I/O are averaged over this interval. 1s to 5m.
  uint64_t usage_interval_us = 10'000'000;
  // The address other machines reach this machine's tasks at (published in discovery);
  // "" = the address its control-plane session comes from.
  std::string advertise_address;
  // [bridge] (docs/networking.md): the machine's bridge for tasks with
  // namespaces.network = "bridge"; an empty name: none (such tasks are refused).
  std::string bridge;
  uint32_t bridge_net = 0;  // host byte order; the bridge itself takes the first address
  int bridge_prefix = 0;
  // Ports on the machine's own addresses (TCP and UDP) that a bridge task may reach.
  std::vector<uint16_t> bridge_host_ports;
  // Ports no task takes on this machine (agent/host_ports.h): those the operator keeps
  // for the machine (`reserved_ports = [22, "2379-2380"]`), beside the agent's own and
  // anything listening on the machine, which are never a task's either.
  std::set<uint16_t> reserved_ports;
  // Network namespaces kept ready for tasks with a private network (agent/netns_pool.h);
  // 0: each start makes its own.
  size_t netns_pool = 4;
  // Sandboxes kept ready (agent/sandbox_pool.h): weft-init waiting in a cgroup and
  // namespaces of its own for the next task's start; 0: each start makes its own.
  size_t sandbox_pool = 2;
};

// Reads and validates a config file; every error names file:line.
Result<AgentConfig> load_agent_config(const std::string& path);
Result<AgentConfig> parse_agent_config(const std::string& text, const std::string& name);

// Fills in defaults that depend on the machine (cgroup root, machine id, init path).
Status resolve_agent_config(AgentConfig* cfg, bool under_systemd);

// The cgroup root must be (or be created) on a cgroup2 filesystem: `cgroup_root =
// "/etc"` would otherwise have the agent write cgroup.procs files into /etc.
Status check_cgroup2_dir(const std::string& path);

}  // namespace weft::agent
