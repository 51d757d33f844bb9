// weftctl's cluster commands (weft-controlplane): machine, entitlement, job and
// `task ls --cluster`.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/task.h"
#include "cli/util.h"

namespace weft::cli {

struct ClusterCommands {
  CLI::App *machine = nullptr, *m_ls = nullptr, *m_show = nullptr, *m_drain = nullptr,
           *m_rm = nullptr, *m_assign = nullptr, *m_release = nullptr;
  std::string target;  // machine assign's entitlement
  CLI::App *ent = nullptr, *e_create = nullptr, *e_ls = nullptr, *e_show = nullptr,
           *e_owners = nullptr, *e_grant = nullptr, *e_update = nullptr, *e_rm = nullptr;
  int64_t max_unavailable = 1;
  // entitlement grant: what its jobs' tasks may ask of the host (docs/security.md).
  bool g_privileged = false, g_seccomp = false, g_host_network = false, g_low_ports = false;
  std::vector<std::string> g_users, g_groups, g_namespaces, g_paths;
  CLI::App *audit = nullptr, *a_ls = nullptr, *web = nullptr;
  CLI::App *cp = nullptr, *cp_status = nullptr;
  CLI::App *maint = nullptr, *mt_schedule = nullptr, *mt_ls = nullptr, *mt_cancel = nullptr;
  std::string mt_machine, mt_domain, mt_dc, mt_start, mt_duration, mt_notice, mt_reason;
  bool mt_reboot = false, mt_all = false;
  uint64_t mt_id = 0;
  std::vector<std::string> owners;
  std::string since;
  int64_t limit = 1000;
  CLI::App *svc = nullptr, *s_ls = nullptr, *s_show = nullptr, *s_watch = nullptr;
  int watch_s = 0;  // service watch: stop after this many seconds (0: until interrupted)
  CLI::App *job = nullptr, *j_create = nullptr, *j_ls = nullptr, *j_show = nullptr,
           *j_scale = nullptr, *j_update = nullptr, *j_stop = nullptr, *j_logs = nullptr;
  int64_t index = 0, tail = -1;  // job logs
  std::string stream = "all";
  bool follow = false, raw = false;
  std::string name, file, profile, dc;
  int64_t quota = 0, count = 0;
  bool undo = false, detach = false;
  int timeout_s = 300;
};

void add_cluster_commands(CLI::App& app, ClusterCommands& c);
// Runs the parsed cluster command and returns its exit code, or -1 when none was given.
int run_cluster_commands(const ClusterCommands& c, const Globals& g);
// `weftctl task ls --cluster`: every task the control plane knows.
int cluster_task_ls(const Globals& g);
// Follows a job until every task runs its current generation, a batch job until it
// ends (create, scale, update, revert): its exit code.
int follow_job(CpClient& c, const std::string& name, int timeout_s, bool json_out);
// `weftctl task logs` of a task the local agent does not have, and `weftctl job logs`:
// through the control plane (docs/logs.md).
int cluster_logs(const Globals& g, const json& target, LogOptions o);

}  // namespace weft::cli
