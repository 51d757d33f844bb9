// The agent's door to the cgroup v2 tree.
//
// CgroupFs is the narrow filesystem interface (mkdir, rmdir, read, write) with a real
// implementation and a fake one that emulates enough kernel behaviour for unit tests
// (interface files on mkdir, recursive rmdir, freeze reflected in cgroup.events).
// CgroupTree builds the agent's layout on top of it:
//
//   <root>/                 the agent's cgroup root (delegated under systemd)
//   <root>/agent/           leaf holding the agent process (when the agent lives
//                           in its root; under systemd it stays in its own unit)
//   <root>/holder/          whatever else systemd started in a delegated root
//   <root>/tasks/<id>/      one cgroup per task
//
// Limits are computed by limit_writes() — a pure function — and written before any
// process enters the cgroup.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/paths.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

class CgroupFs {
 public:
  virtual ~CgroupFs() = default;
  virtual Status mkdir(const std::string& dir) = 0;  // ok if it exists
  virtual Status rmdir(const std::string& dir) = 0;  // ok if it is gone
  virtual Result<std::string> read(const std::string& file) = 0;
  virtual Status write(const std::string& file, const std::string& value) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual Result<std::vector<std::string>> subdirs(const std::string& dir) = 0;
};

// The kernel's cgroupfs (testing/fake_cgroupfs.h fakes it for unit tests).
class RealCgroupFs : public CgroupFs {
 public:
  Status mkdir(const std::string& dir) override;
  Status rmdir(const std::string& dir) override;
  Result<std::string> read(const std::string& file) override;
  Status write(const std::string& file, const std::string& value) override;
  bool exists(const std::string& path) override;
  Result<std::vector<std::string>> subdirs(const std::string& dir) override;
};

std::unique_ptr<CgroupFs> make_real_cgroupfs();

struct CgroupWrite {
  std::string file;        // e.g. "memory.max"
  std::string value;       // e.g. "268435456"
  std::string controller;  // e.g. "memory"
  std::string field;       // spec field for errors, e.g. "resources.memory_max"
};

// The interface-file writes that implement `r`. Pure.
std::vector<CgroupWrite> limit_writes(const TaskResources& r);

// Splits writes into those this machine can apply and the rest. A missing controller
// is an error naming the field unless r.best_effort, in which case a warning is
// returned for each skipped write. Hugetlb sizes must be in `hugepage_sizes`.
struct LimitPlan {
  std::vector<CgroupWrite> apply;
  std::vector<std::string> warnings;
};
Result<LimitPlan> plan_limits(const TaskResources& r, const std::set<std::string>& controllers,
                              const std::set<std::string>& hugepage_sizes);

struct CgroupStats {
  std::optional<uint64_t> cpu_usage_usec, cpu_user_usec, cpu_system_usec;
  std::optional<uint64_t> cpu_throttled_usec, cpu_nr_throttled;
  std::optional<uint64_t> memory_current, memory_peak;
  std::optional<uint64_t> pids_current;
  std::map<std::string, nlohmann::json> pressure;  // "cpu" -> {"some": {...}, "full": {...}}
  nlohmann::json to_json() const;
};

// The counters task.usage is worked out from (agent/usage.h).
struct UsageCounters {
  uint64_t cpu_usec = 0;                           // cpu.stat usage_usec
  uint64_t mem_bytes = 0;                          // memory.current
  uint64_t io_read_bytes = 0, io_write_bytes = 0;  // io.stat, summed over devices
};
// io.stat's rbytes and wbytes summed over its devices ("8:0 rbytes=1 wbytes=2 ...").
std::pair<uint64_t, uint64_t> io_stat_bytes(std::string_view io_stat);

class CgroupTree {
 public:
  CgroupTree(CgroupFs& fs, std::string root, HostPaths host);

  const std::string& root() const { return root_; }
  std::string task_dir(const std::string& id) const { return root_ + "/tasks/" + id; }
  std::string agent_dir() const { return root_ + "/agent"; }

  // Creates root and tasks/; with self_pid > 0 also agent/ and moves the agent there.
  // Moves any other process found in the root into holder/, then enables every
  // available controller for tasks/ and its children.
  Status setup(int self_pid);
  const std::set<std::string>& controllers() const { return controllers_; }
  const std::set<std::string>& hugepage_sizes() const { return hugepage_sizes_; }

  Status create_task(const std::string& id, const std::vector<CgroupWrite>& writes);
  // Writes a task's limits into its existing cgroup (a sandbox's, agent/sandbox_pool.h).
  // The error names the spec field of the write that failed.
  Status apply_limits(const std::string& id, const std::vector<CgroupWrite>& writes);
  // Kills everything in the task cgroup and removes it; waits up to `wait_ms` for the
  // processes to go. Ok if it does not exist.
  Status remove_task(const std::string& id, int wait_ms = 2000);
  Status kill_task(const std::string& id);
  // The task's usage counters; none when its cgroup is gone (a controller this machine
  // lacks counts 0).
  std::optional<UsageCounters> usage(const std::string& id);
  // The cgroup an exec readiness check (or, `liveness`, an exec liveness check: one of
  // each may run at once) runs in, beneath its task's (made if missing): what the
  // check's command starts stays in it, so a check ends with everything it started.
  // end_check kills what is left and removes it (if the killed are still leaving, the
  // next check reuses it and remove_task removes it).
  Result<std::string> check_dir(const std::string& id, bool liveness = false);
  void end_check(const std::string& id, bool liveness = false);
  // The same for one `weftctl task exec` (`n`: its number on this agent): each in a
  // cgroup of its own, which ends with everything the command started.
  // end_exec: true once the cgroup is gone (false while the killed still leave: ask again).
  Result<std::string> exec_dir(const std::string& id, uint64_t n);
  bool end_exec(const std::string& id, uint64_t n);
  Status freeze_task(const std::string& id, bool frozen);
  Result<bool> frozen(const std::string& id);
  Result<bool> populated(const std::string& id);
  Result<std::vector<int>> procs(const std::string& id);
  Result<std::vector<std::string>> task_ids();
  // memory.events oom_kill count; nullopt without the memory controller.
  std::optional<uint64_t> oom_kills(const std::string& id);
  CgroupStats stats(const std::string& id);

 private:
  // A cgroup beneath the task's for a command joined to it (`name` starts with '/').
  Result<std::string> helper_dir(const std::string& id, const std::string& name);
  bool end_helper(const std::string& id, const std::string& name);
  Result<std::map<std::string, std::string>> read_keyed(const std::string& file);
  Status enable_in_ancestors();
  CgroupFs& fs_;
  std::string root_;
  HostPaths host_;
  std::set<std::string> controllers_;
  std::set<std::string> hugepage_sizes_;
};

}  // namespace weft::agent
