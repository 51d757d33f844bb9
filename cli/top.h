// weftctl top (docs/operations.md): what running tasks use, through the control plane,
// by job (the default), task or machine.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/util.h"

namespace weft::cli {

struct TopCommands {
  CLI::App* top = nullptr;
  std::string of = "jobs", job, entitlement, machine;
};

void add_top_commands(CLI::App& app, TopCommands& c);
// Runs the parsed command and returns its exit code, or -1 when none was given.
int run_top_commands(const TopCommands& c, const Globals& g);

}  // namespace weft::cli
