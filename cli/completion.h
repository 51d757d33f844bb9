// weftctl completion bash|zsh (generated from the command table) and the hidden
// weftctl __names KIND the scripts call for names from the control plane.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/util.h"

namespace weft::cli {

struct CompletionCommands {
  CLI::App *completion = nullptr, *names = nullptr;
  std::string shell, kind;
};

void add_completion_commands(CLI::App& app, CompletionCommands& c);
// `app` is the whole command table (every group built). Returns the exit code, or -1
// when neither command was given.
int run_completion_commands(const CompletionCommands& c, const CLI::App& app, const Globals& g);

}  // namespace weft::cli
