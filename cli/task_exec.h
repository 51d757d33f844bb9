// `weftctl task exec ID -- CMD...` (docs/operations.md, "A command inside a task"): a
// command inside a running task of the cluster, with a terminal (-t; the default when
// stdin and stdout are terminals) or with pipes (-T), its input and output carried over
// the session with the control plane. The exit status is the command's.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/task.h"
#include "cli/util.h"

namespace weft::cli {

struct TaskExecCommand {
  CLI::App* exec = nullptr;
  std::string id;
  std::vector<std::string> command;
  bool tty = false, no_tty = false;
};

// Adds `task exec` to the task commands (add_task_commands first).
void add_task_exec_command(TaskCommands& tasks, TaskExecCommand& c);
// Runs it and returns the command's exit code, or -1 when it was not given.
int run_task_exec_command(const TaskExecCommand& c, const Globals& g);

}  // namespace weft::cli
