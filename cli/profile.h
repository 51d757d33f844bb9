// weftctl profile: host profiles (weft-sidekick): list, show, plan, switch, verify, off,
// import-tuned, history.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/util.h"

namespace weft::cli {

struct ProfileCommands {
  CLI::App* profile = nullptr;
  CLI::App *ls = nullptr, *show = nullptr, *active = nullptr, *plan = nullptr, *switch_to = nullptr,
           *verify = nullptr, *off = nullptr, *import_tuned = nullptr, *history = nullptr;
  std::string name, tuned_path;
  int limit = 20;
  bool no_wait = false;
};

void add_profile_commands(CLI::App& app, ProfileCommands& c);
// Runs the parsed profile command and returns its exit code (switch, verify and off:
// 0 ok, 1 failed, 3 degraded, 4 reboot required, 5 drift), or -1 when none was given.
int run_profile_commands(const ProfileCommands& c, const Globals& g);

}  // namespace weft::cli
