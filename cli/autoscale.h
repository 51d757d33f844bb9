// weftctl's autoscaling commands (docs/jobs.md, "Autoscaling"): job autoscale show,
// pause and resume.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/cluster.h"
#include "cli/util.h"

namespace weft::cli {

struct AutoscaleCommands {
  CLI::App *group = nullptr, *show = nullptr, *pause = nullptr, *resume = nullptr;
  std::string name;
};

// `job autoscale ...` joins the cluster commands' `job` group.
void add_autoscale_commands(ClusterCommands& cluster, AutoscaleCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none was given.
int run_autoscale_commands(const AutoscaleCommands& c, const Globals& g);

}  // namespace weft::cli
