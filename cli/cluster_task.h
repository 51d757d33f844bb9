// weftctl's operations on one task of the cluster, through the control plane
// (docs/operations.md, "One task"): `task restart ID`, `task signal ID SIGNAL`, and
// `--cluster` on `task show` and `task kill` (which otherwise ask this machine's agent).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/task.h"
#include "cli/util.h"

namespace weft::cli {

struct ClusterTaskCommands {
  CLI::App *restart = nullptr, *signal = nullptr;
  std::string id, sig;
  bool show_cluster = false, kill_cluster = false;
};

// Adds to the task commands (add_task_commands first).
void add_cluster_task_commands(TaskCommands& tasks, ClusterTaskCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none of these was given.
int run_cluster_task_commands(const TaskCommands& tasks, const ClusterTaskCommands& c,
                              const Globals& g);

}  // namespace weft::cli
