// weftctl completion bash|zsh (generated from the command table) and the hidden
// weftctl __names KIND the scripts call for names from the control plane.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/handlers.h"
#include "cli/util.h"

namespace weft::cli {

// completion bash|zsh and __names KIND; built with every group (the table is whole).
void add_completion_commands(CLI::App& app, Handlers& h);

}  // namespace weft::cli
