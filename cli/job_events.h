// weftctl job events (docs/jobs.md, "Events"): what happened to a job's tasks, paged.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cluster.h"
#include "cli/util.h"

namespace weft::cli {

struct JobEventsCommands {
  CLI::App* events = nullptr;
  std::string name;
  int64_t after = 0, limit = 100;
};

// `job events` joins the cluster commands' `job` group.
void add_job_events_commands(ClusterCommands& cluster, JobEventsCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none was given.
int run_job_events_commands(const JobEventsCommands& c, const Globals& g);

}  // namespace weft::cli
