// weftctl health: the machine's verdict and probes (weft-hcs).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/handlers.h"
#include "cli/util.h"

namespace weft::cli {

// health (the verdict: exit 0 ok, 3 degraded, 1 failed or unknown), health probes,
// health history.
void add_health_commands(CLI::App& app, Handlers& h);

}  // namespace weft::cli
