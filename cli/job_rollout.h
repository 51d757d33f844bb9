// weftctl job history|revert|promote|rollout (docs/jobs.md, "Rollouts"): a job's
// revisions, a revert to one, its canaries promoted, its rollout paused, resumed or
// aborted.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cluster.h"
#include "cli/util.h"

namespace weft::cli {

struct JobRolloutCommands {
  CLI::App *history = nullptr, *revert = nullptr, *promote = nullptr, *rollout = nullptr;
  CLI::App *pause = nullptr, *resume = nullptr, *abort = nullptr;
  std::string name;
  uint64_t generation = 0;
  bool detach = false;
  int timeout_s = 600;
};

// They join the cluster commands' `job` group.
void add_job_rollout_commands(ClusterCommands& cluster, JobRolloutCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none was given.
int run_job_rollout_commands(const JobRolloutCommands& c, const Globals& g);

}  // namespace weft::cli
