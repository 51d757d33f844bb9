// What a task may ask of the host, and who grants it (docs/security.md).
//
// A task is untrusted code, and a job's task spec is written by an operator whose role
// reaches one entitlement. Every spec field that touches the host is a privilege: a
// named user or group (a uid or gid shared with the host), a namespace shared with the
// host, a host directory bound in or used as the root, the seccomp filter off. A spec
// asks for none of them by default ("restricted", as Kubernetes' Pod Security level):
// its task runs as a uid of its own, in namespaces of its own, on its image's root or
// the host's read-only view. An admin grants named exceptions per entitlement
// (entitlement.create/update "grants"); the control plane checks every job.create and
// job.update against them. Root (uid or gid 0) and the local sockets' group are never
// grantable: a task in that group is an admin of every daemon on its machine.
//
// One parser and one checker for every component: the control plane checks jobs with
// them, weftctl parses the grants it sends, the agent refuses the never-grantable ones
// whatever asks (a spec, an image's configured user).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "common/task_spec.h"

namespace weft {

struct TaskGrants {
  // Every privilege below without naming it, except the never-grantable ones.
  bool privileged = false;
  std::vector<std::string> users;   // what a spec's "user" may name (a name or a number)
  std::vector<std::string> groups;  // what a spec's "group" may name
  // Namespaces a task may share with the host: "pid", "ipc", "uts", "mount".
  std::set<std::string> host_namespaces;
  // Host directories (and what is under them) a task may bind in ("mounts[].source") or
  // use as its root ("rootfs"). The machine's agent.toml [volumes] must allow them too.
  std::vector<std::string> host_paths;
  bool seccomp_unconfined = false;
  // The host's network (namespaces.network = "host"): every port of the machine, and
  // what it serves on loopback. Without it a job's task gets a network namespace of its
  // own (namespaces.network = "own": the machine's bridge, or a private one).
  bool host_network = false;
  // Fixed ports below 1024 (ports = { http = 80 }), published on the machine's addresses.
  bool low_ports = false;

  bool operator==(const TaskGrants&) const = default;
};

// Parses an entitlement's "grants" object; errors name the field ("grants.users[1]").
// Refuses what can never be granted (root, the sockets' group `socket_group`).
Result<TaskGrants> parse_task_grants(const nlohmann::json& j,
                                     const std::string& socket_group = "weft");
nlohmann::json to_json(const TaskGrants& g);

// A job's fixed port below 1024 without grants.low_ports: the error naming it (ports.NAME),
// else ok.
Status check_port_grants(const std::map<std::string, uint16_t>& ports, const TaskGrants& grants,
                         const std::string& entitlement, const std::string& prefix);
// Ok when `grants` covers every privilege `spec` asks for; else an error that names the
// first field not granted, the entitlement, and how an admin grants it. Never-grantable
// asks (root, the sockets' group) are refused whatever the grants.
Status check_task_grants(const TaskSpec& spec, const TaskGrants& grants,
                         const std::string& entitlement, const std::string& socket_group = "weft",
                         const std::string& prefix = "task.");

// True for a user or group that names root ("root", "0") or the sockets' group.
bool never_grantable_user(const std::string& user);
bool never_grantable_group(const std::string& group, const std::string& socket_group);
// A group's number on this host, looked up once per name and remembered (a lookup may
// ask a slow NSS service: a daemon looks its socket group up at start, never per call).
std::optional<unsigned long> group_number(const std::string& name);

}  // namespace weft
