// The command line the agent starts weft-init with, for both of its callers: a task's
// start (spawn.cc's spawn_init, or a sandbox's hand-off) and a command joined to a
// running task (readiness exec checks). weft-init reads it with agent/init/args.h.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "agent/identity.h"
#include "agent/spawn.h"
#include "agent/task_root.h"
#include "common/task_spec.h"

namespace weft::agent {

// A task's start: its main process, in its own root and mounts.
struct InitStart {
  uint64_t incarnation = 0;
  const OverlayRoot* overlay = nullptr;  // an image's root, or none
  // The resolved host path of each bind mount of spec.mounts, in order (the spec's own
  // sources where this is short).
  std::vector<std::string> bind_sources;
  bool lo_up = false;  // the task's network namespace has its loopback up already
  // Copy the output to journald with these fields ("KEY=VALUE", the first naming the
  // task; none: no copy; agent.toml log_journald), through this socket.
  std::vector<std::string> journal_fields;
  std::string journal_socket;
};
// A command inside a running task (`pid`: its weft-init; fd 3 its pidfd): a readiness
// or liveness check's, with the task's identity, cwd, confinement and environment.
struct InitJoin {
  pid_t pid = -1;
  std::vector<std::string> command;
  // `weftctl task exec`: stdin is a terminal (weft-init --tty), and variables set where
  // the task's own environment does not (TERM).
  bool tty = false;
  std::map<std::string, std::string> env_defaults;
};

std::vector<std::string> init_argv(const TaskSpec& spec, const Identity& id,
                                   const std::variant<InitStart, InitJoin>& call);

}  // namespace weft::agent
