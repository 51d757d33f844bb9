// weftctl's commands for a region's shards (docs/regions.md): entitlement move, shard drain.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/cluster.h"
#include "cli/util.h"

namespace weft::cli {

struct RegionCommands {
  CLI::App *e_move = nullptr, *shard = nullptr, *s_drain = nullptr;
  std::string name, to;
  bool detach = false;
  int timeout_s = 600;
};

// `entitlement move` joins the cluster commands' `entitlement` group.
void add_region_commands(CLI::App& app, ClusterCommands& cluster, RegionCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none was given.
int run_region_commands(const RegionCommands& c, const Globals& g);

}  // namespace weft::cli
