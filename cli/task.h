// weftctl task and agent: tasks on this machine's weft-agent (run, ls, show, stop, kill,
// freeze, thaw, rm, logs) and `agent info`. `task ls --cluster` asks the control plane.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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

struct TaskCommands {
  CLI::App *task = nullptr, *agent = nullptr, *agent_info = nullptr;
  CLI::App *run = nullptr, *ls = nullptr, *show = nullptr, *stop = nullptr, *kill = nullptr,
           *freeze = nullptr, *thaw = nullptr, *rm = nullptr, *logs = nullptr;
  // weftctl image ls | pull | rm | prune (the agent's image cache).
  CLI::App *image = nullptr, *image_ls = nullptr, *image_pull = nullptr, *image_rm = nullptr,
           *image_prune = nullptr;
  std::string image_ref;
  RunOptions ro;
  std::string id, grace, sig = "SIGKILL", stream = "all";
  bool ls_all = true, ls_cluster = false, follow = false, logs_cluster = false, raw = false;
  bool run_wait = false, run_rm = false;  // task run --wait [--rm]
  int64_t tail = -1;
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

void add_task_commands(CLI::App& app, TaskCommands& c);
// Runs the parsed task or agent command and returns its exit code, or -1 when none was
// given.
int run_task_commands(const TaskCommands& c, const Globals& g);

}  // namespace weft::cli
