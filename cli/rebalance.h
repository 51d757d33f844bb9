// weftctl's ReBalancer commands (docs/rebalancer.md): rebalance plan, status, pause,
// resume.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/util.h"

namespace weft::cli {

struct RebalanceCommands {
  CLI::App *group = nullptr, *plan = nullptr, *status = nullptr, *pause = nullptr,
           *resume = nullptr;
  std::string entitlement;
  bool exact = false;
  int64_t budget = 0;
};

void add_rebalance_commands(CLI::App& app, RebalanceCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none was given.
int run_rebalance_commands(const RebalanceCommands& c, const Globals& g);

}  // namespace weft::cli
