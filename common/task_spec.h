// TaskSpec: what an operator asks the agent to run. Parsed from the JSON params of
// task.run (docs/protocol.md) into plain structs; every error names the field.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

enum class RestartPolicy { kNever, kOnFailure, kAlways };
// host: the machine's network; private: a namespace with only lo; bridge: a namespace
// with an address on the machine's bridge, its ports published on the machine's address
// (agent.toml [bridge], docs/networking.md); own: a namespace of the task's own, bridge
// where the machine has a bridge and private otherwise (the agent decides at the start;
// the default for a job's tasks, docs/security.md). A spec sent to the agent without
// namespaces.network is "host" (an admin's local `weftctl task run`).
enum class NetworkMode { kHost, kPrivate, kBridge, kOwn };

struct IoLimit {
  std::string device;  // "MAJ:MIN"
  std::optional<uint64_t> rbps, wbps, riops, wiops;
};

struct TaskResources {
  std::optional<double> cpu;            // cores, e.g. 0.5 -> cpu.max "50000 100000"
  std::optional<uint64_t> cpu_weight;   // 1..10000
  std::optional<uint64_t> memory_max;   // bytes
  std::optional<uint64_t> memory_high;  // bytes
  std::optional<uint64_t> memory_swap_max;
  std::optional<uint64_t> pids_max;
  std::vector<IoLimit> io_max;
  std::map<std::string, uint64_t> hugetlb;  // kernel page-size name ("2MB", "1GB") -> bytes
  std::string cpuset_cpus;
  std::string cpuset_mems;
  // When true, a limit whose controller this machine lacks is skipped with a warning
  // instead of rejecting the task.
  bool best_effort = false;
};

struct Namespaces {
  bool pid = true, mount = true, uts = true, ipc = true;
  NetworkMode network = NetworkMode::kHost;
  bool own_network() const { return network != NetworkMode::kHost; }
};

struct RestartSpec {
  RestartPolicy policy = RestartPolicy::kNever;
  uint64_t delay_us = 1'000'000;          // first backoff delay
  uint64_t max_delay_us = 60'000'000;     // backoff cap
  uint64_t reset_after_us = 600'000'000;  // a run this long resets the backoff
  int64_t max_restarts = -1;              // -1 = unlimited
};

struct LogSpec {
  uint64_t max_file_bytes = 10u << 20;
  uint64_t max_files = 5;  // per stream; total bound = max_file_bytes * max_files * 2
};

// A readiness check the agent runs against a running task (docs/jobs.md): the task is
// "ready" (available to rolling updates, drains and its TaskController) once
// `success_threshold` checks in a row passed, and not ready again after
// `failure_threshold` failures in a row. TCP and HTTP connect to 127.0.0.1:port in the
// task's network namespace; exec runs `command` inside the task's namespaces, cgroup,
// credentials and confinement.
enum class ReadinessKind { kTcp, kHttp, kExec };
struct ReadinessCheck {
  ReadinessKind kind = ReadinessKind::kTcp;
  uint16_t port = 0;  // tcp, http
  // Or one of the task's named ports (`port = "http"`): the agent puts its number in
  // `port` when it gives the task its ports (resolve_task_ports).
  std::string port_name;
  std::string path = "/";            // http: 2xx and 3xx answers pass
  std::vector<std::string> command;  // exec: exit status 0 passes
  uint64_t interval_us = 1'000'000;
  uint64_t timeout_us = 1'000'000;
  uint64_t initial_delay_us = 0;
  uint64_t success_threshold = 1;
  uint64_t failure_threshold = 3;
};
const char* readiness_kind_name(ReadinessKind k);

// What a task with a root of its own (an image or a rootfs) gets mounted beside it
// (docs/images.md): a host directory the machine allows (agent.toml [volumes]), or a
// tmpfs. Targets are absolute, plain (no "." or ".."), outside /proc, /dev and /sys.
enum class MountKind { kBind, kTmpfs };
struct MountSpec {
  MountKind kind = MountKind::kBind;
  std::string source;         // bind: the host path
  std::string target;         // inside the task
  bool readonly = true;       // bind: read-only unless the spec says otherwise
  uint64_t size = 64u << 20;  // tmpfs
  uint32_t mode = 01777;      // tmpfs: the mount's root directory
};
// A file delivered into the task from its spec (a configuration or a secret): written
// to a tmpfs of the task's own, owned by the task's user with `mode` (0400 by default),
// mounted read-only at `path`. Never in argv, env or on the machine's disk.
struct FileSpec {
  std::string path;
  std::string content;
  uint32_t mode = 0400;
};

// A tarball the task runs (docs/images.md): fetched from `url` (http or https), used
// only if its bytes hash to `sha256`, unpacked once per machine and shared read-only by
// every task that names it. At `target` "/" it is the task's root (with a writable
// directory of the task's own, as for an image); with an image or a rootfs it is mounted
// read-only at `target`, a directory inside the task.
struct PackageSpec {
  std::string url;
  std::string sha256;  // 64 lowercase hex digits
  std::string target = "/";
};

struct TaskSpec {
  std::string name;
  // The program and its arguments. With an image it may be empty: the image's
  // entrypoint and cmd are the default (a given argv replaces both).
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // over the image's env, if any
  std::string cwd;                         // empty: the image's working directory, else "/"
  // An OCI image ("<registry>/<repository>[:tag][@<digest>]", canonical form) the task's
  // root is made from (docs/images.md): an overlayfs of its layers with a writable
  // directory of the task's own. Empty: the host's root (or `rootfs`).
  std::string image;
  std::optional<PackageSpec> package;
  std::vector<MountSpec> mounts;
  std::vector<FileSpec> files;
  std::string user;   // name or numeric; empty = the agent's default_task_user
  std::string group;  // name or numeric; empty = user's primary group
  TaskResources resources;
  std::string rootfs;  // empty = host root
  Namespaces ns;
  std::string hostname;
  // The default seccomp filter is off only when the spec says "unconfined" and the
  // agent's configuration allows it.
  bool seccomp_unconfined = false;
  RestartSpec restart;
  int stop_signal = 15;
  uint64_t stop_grace_us = 10'000'000;
  LogSpec logs;
  std::optional<ReadinessCheck> readiness;
  // A liveness check (docs/jobs.md, "Liveness checks"): the same kinds and fields as
  // readiness (success_threshold unused). After `failure_threshold` failures in a row
  // the task is restarted: a local task by its agent (killed; its restart policy
  // decides), a control plane's task by the control plane (its TaskController asked
  // first, as for any restart).
  std::optional<ReadinessCheck> liveness;
  // Named ports the task listens on in the host's network (docs/services.md): name ->
  // port; 0 = any free port of the agent's port_range, chosen at start. The task finds
  // them as WEFT_PORT_<NAME> in its environment.
  std::map<std::string, uint16_t> ports;
  // Who started the task: empty for operators, "controlplane" for tasks the control
  // plane placed (only those are in the agent's reports to it).
  std::string owner;
  // A control-plane task's entitlement (set by the control plane; for journald's
  // WEFT_ENTITLEMENT and the agent's listings).
  std::string entitlement;
  // A control-plane task of an at-most-one job (JobCopies, common/job_spec.h): its agent
  // stops it on its own when the machine's lease from the control plane runs out
  // (agent/machine_lease.h). Set by the control plane only.
  bool at_most_one = false;
};

// Parses and validates. Errors carry `field` ("resources.memory_max").
Result<TaskSpec> parse_task_spec(const nlohmann::json& j);
// A spec's `package` table alone (image.pull takes one); errors name "package.<key>".
Result<PackageSpec> parse_package_spec(const nlohmann::json& j);
// The canonical form stored in the database; parse_task_spec(to_json(s)) == s.
nlohmann::json to_json(const TaskSpec& s);

// A port's name: 1-15 lowercase letters, digits and '-', starting with a letter and not
// ending with '-' (an RFC 6335 service name: it becomes the `_<name>._tcp` of an SRV
// record).
inline constexpr size_t kMaxTaskPorts = 16;
bool valid_port_name(const std::string& name);
// WEFT_PORT_<NAME>: the name upper-cased, '-' as '_'.
std::string port_env_name(const std::string& name);
// Gives every port of `spec` a number: a 0 takes the first port of [first, last] for
// which taken(port) is false (taken also says which fixed ports another task holds: a
// fixed port that is taken is refused, naming it and `holder`); then the readiness
// check's named port, and WEFT_PORT_<NAME> in the environment. `next` (optional) is
// where the search for a free port starts and is moved past the ports chosen, so a
// port just let go is the last to be taken again. `machines_own` (optional) says why a
// port is the machine's own (agent/host_ports.h): a fixed one is refused naming it, and
// a 0 never takes one.
Status resolve_task_ports(TaskSpec* spec, uint16_t first, uint16_t last,
                          const std::function<std::string(uint16_t)>& holder,
                          uint16_t* next = nullptr,
                          const std::function<std::string(uint16_t)>& machines_own = nullptr);

Result<int> parse_signal(const std::string& s);  // "SIGTERM", "TERM", "15"
std::string signal_name(int sig);
const char* policy_name(RestartPolicy p);
const char* network_name(NetworkMode m);
// "2M" / "2MB" / "2048kB" -> "2MB" (the cgroup file name form); empty on bad input.
std::string normalize_hugepage_size(const std::string& s);

}  // namespace weft
