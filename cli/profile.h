// weftctl profile: host profiles (weft-sidekick): list, show, plan, switch, verify, off,
// import-tuned, history.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/handlers.h"
#include "cli/util.h"

namespace weft::cli {

// switch, verify and off exit with 0 ok, 1 failed, 3 degraded, 4 reboot required, 5 drift.
void add_profile_commands(CLI::App& app, Handlers& h);

}  // namespace weft::cli
