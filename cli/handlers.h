// What runs a weftctl command: each command file registers a leaf subcommand's handler
// beside that subcommand's options, and main runs the one the command line named.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/util.h"

namespace weft::cli {

class Handlers {
 public:
  using Handler = std::function<int(const Globals&)>;

  // `run` answers `cmd` when the command line ends with it (`weftctl health` has one, and
  // so do `health probes` and `health history`).
  void on(CLI::App* cmd, Handler run) { table_.emplace_back(cmd, std::move(run)); }

  // The exit code of the handler of the subcommand the command line ended with, or -1
  // when it is none of these.
  int run(const Globals& g) const {
    for (const auto& [cmd, handler] : table_)
      if (cmd->parsed() && cmd->get_subcommands().empty()) return handler(g);
    return -1;
  }

 private:
  std::vector<std::pair<CLI::App*, Handler>> table_;
};

}  // namespace weft::cli
