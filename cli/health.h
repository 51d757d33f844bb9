// weftctl health: the machine's verdict and probes (weft-hcs).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/util.h"

namespace weft::cli {

struct HealthCommands {
  CLI::App *health = nullptr, *probes = nullptr, *history = nullptr;
  std::vector<std::string> names;
  int limit = 50;
};

void add_health_commands(CLI::App& app, HealthCommands& c);
// Runs the parsed health command and returns its exit code (0 ok, 3 degraded, 1 failed
// or unknown), or -1 when none was given.
int run_health_commands(const HealthCommands& c, const Globals& g);

}  // namespace weft::cli
