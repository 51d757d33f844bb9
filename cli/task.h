// weftctl task and agent: tasks on this machine's weft-agent (run, ls, show, stop, kill,
// freeze, thaw, rm, logs) and `agent info`. `task ls --cluster` asks the control plane.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/handlers.h"
#include "cli/util.h"

namespace weft::cli {

// `task run`'s flags, turned into a task spec (common/task_spec.h).
struct RunOptions {
  std::string name, cpu, memory, memory_high, swap, cwd, user, group, rootfs, hostname, image;
  std::string net = "host", restart = "never", restart_delay, restart_max_delay, restart_reset;
  std::string stop_signal, stop_grace, log_max_size, cpuset_cpus, cpuset_mems, spec_file;
  std::string package, package_sha256, package_target;
  int64_t cpu_weight = 0, pids = 0, max_restarts = -2, log_max_files = 0;
  std::vector<std::string> env, io_max, hugetlb, share, argv;
  bool best_effort = false;
};

// How `task logs` and `job logs` print: the streams ("stdout", "stderr" or "all"), follow
// until the task ended, start `tail` lines before the end (-1: from the start), one JSON
// object per chunk; long_poll: the daemon waits for new output (the control plane does).
struct LogOptions {
  std::string stream = "all";
  bool follow = false;
  int64_t tail = -1;
  bool as_json = false;
  bool long_poll = false;
  // Bytes as the task wrote them, also to a terminal (where control characters are
  // otherwise shown as \xNN: a task's output must not drive the operator's terminal).
  bool raw = false;
};
// Prints a task's output through task.logs, from an agent ({"id"}) or the control plane
// ({"task"} or {"job", "index"}): the same cursors either way. Returns the exit code.
int stream_logs(rpc::Client& c, const json& target, const LogOptions& o);

// task, agent and image; returns `task`, which the commands below join.
CLI::App* add_task_commands(CLI::App& app, Handlers& h);
// `task restart` and `task signal` through the control plane (cli/cluster_task.cc), and
// what `task show --cluster` and `task kill --cluster` call.
void add_cluster_task_commands(CLI::App* task, Handlers& h);
int cluster_task_show(const Globals& g, const std::string& id);
int cluster_task_signal(const Globals& g, const std::string& id, const std::string& signal);
// `task exec` (cli/task_exec.cc).
void add_task_exec_command(CLI::App* task, Handlers& h);

}  // namespace weft::cli
