// weftctl's commands of weft-controlplane, one file a noun: machine.cc, entitlement.cc,
// job.cc (with job_rollout.cc, job_events.cc and autoscale.cc beside it), service.cc,
// maintenance.cc, audit.cc, web.cc, controlplane.cc, region.cc, rebalance.cc and top.cc. Each
// registers its subcommands with their options and handlers; this header is what they share: the
// tables, following an operation to its end, and the calls other groups make through the control
// plane (`task ls --cluster`, a task's logs).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/handlers.h"
#include "cli/task.h"
#include "cli/util.h"
#include "common/task_state.h"

namespace weft::cli {

// The nouns other command files hang their subcommands on (region moves under
// entitlement; rollouts, events and autoscaling under job).
struct ClusterNouns {
  CLI::App* machine = nullptr;
  CLI::App* entitlement = nullptr;
  CLI::App* job = nullptr;
};
// Every noun below.
ClusterNouns add_cluster_commands(CLI::App& app, Handlers& h);
CLI::App* add_machine_commands(CLI::App& app, Handlers& h);
CLI::App* add_entitlement_commands(CLI::App& app, Handlers& h);
CLI::App* add_job_commands(CLI::App& app, Handlers& h);
void add_service_commands(CLI::App& app, Handlers& h);
void add_maintenance_commands(CLI::App& app, Handlers& h);
void add_audit_commands(CLI::App& app, Handlers& h);
void add_web_commands(CLI::App& app, Handlers& h);
void add_controlplane_commands(CLI::App& app, Handlers& h);
// Subcommands of those nouns, and the nouns of a region and of the fleet's use:
// entitlement move and shard drain (region.cc), job autoscale, job events, job history,
// revert, promote and rollout (job_rollout.cc), rebalance, top.
void add_region_commands(CLI::App& app, const ClusterNouns& cluster, Handlers& h);
void add_autoscale_commands(CLI::App* job, Handlers& h);
void add_job_events_commands(CLI::App* job, Handlers& h);
void add_job_rollout_commands(CLI::App* job, Handlers& h);
void add_rebalance_commands(CLI::App& app, Handlers& h);
void add_top_commands(CLI::App& app, Handlers& h);

std::unique_ptr<CpClient> cp_client(const Globals& g);
void machine_table(const json& machines);
void task_table(const json& tasks);
// A region's front end answers a listing with what it could reach: the shards it could
// not (`unreachable`) and a list cut short (`truncated`) are said on stderr, so a table
// with rows missing never passes for the whole.
void warn_partial(const json& r, const char* what);
TaskState state_of(const json& task);

// A command that follows its operation until it ends: --detach and --timeout.
struct FollowOptions {
  bool detach = false;
  int timeout_s = 300;
};
void add_follow_options(CLI::App* cmd, FollowOptions& f);
// What one poll of a follow found: a line for the operator (printed when it changes),
// its JSON form, and whether the operation is over.
struct Progress {
  std::string line;
  json j;
  enum class Verdict { kGoing, kDone, kFailed } verdict = Verdict::kGoing;
};
// Polls `poll` every 500 ms, printing each new picture, until it is done (0), failed
// (1) or the timeout passes (1; the control plane carries on; `then` says where to look).
int follow(const std::function<Progress()>& poll, int timeout_s, bool json_out,
           const std::string& then);
// Follows a job until every task runs its current generation, a batch job until it
// ends (create, scale, update, revert): its exit code.
int follow_job(CpClient& c, const std::string& name, int timeout_s, bool json_out);

// `weftctl task ls --cluster`: every task the control plane knows.
int cluster_task_ls(const Globals& g);
// `weftctl task logs` of a task the local agent does not have, and `weftctl job logs`:
// through the control plane (docs/logs.md).
int cluster_logs(const Globals& g, const json& target, LogOptions o);

}  // namespace weft::cli
