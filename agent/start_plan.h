// What a task's start decides before it makes anything, as pure functions of the spec,
// the machine's policy and what is local (its image, its package): the spec it runs
// (with its image's defaults), its overlay root's layout, and the host paths of its bind
// mounts. Manager::start_incarnation() then only makes what the plan says: the task's
// identity, its directories, its cgroup, its namespaces, weft-init.
//
// Nothing here needs root or the agent's state: start_plan_test.cc tests it directly.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/image/service.h"
#include "agent/task_root.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

// The machine's rules a spec must meet to run here (agent.toml).
struct StartPolicy {
  std::vector<std::string> volume_host_paths;  // where bind mounts may come from
  bool allow_unconfined = false;               // seccomp = "unconfined" allowed
};

// What task.run checks before the task exists: bind mounts' sources are allowed, an
// unconfined task is allowed, a rootfs is a directory. Errors name the spec's field.
Status admit_spec(const TaskSpec& spec, const StartPolicy& policy);

struct StartInputs {
  const TaskSpec* spec = nullptr;
  const StartPolicy* policy = nullptr;
  const image::LocalImage* image = nullptr;    // the task's image, local; or none
  const image::LocalImage* package = nullptr;  // its package, local; or none
  std::string layers_root;                     // where layers are: <root>/<algorithm>/<hex>
  std::string task_dir;                        // the task's state directory
};

struct StartPlan {
  TaskSpec run_spec;                     // the spec under its image's defaults
  std::optional<OverlayRoot> overlay;    // an image's (or a package's) root
  std::vector<std::string> image_roots;  // its layer directories, top-most first
  // The resolved host path of each bind mount of run_spec.mounts, in order (a package
  // beside a root of the task's own is the last, read-only at its target).
  std::vector<std::string> bind_sources;
};

// Checked again at every start: the machine's allow-list may have changed since.
Result<StartPlan> plan_start(const StartInputs& in);

// Makes the overlay's upper, work and rootfs directories; the upper one 0755 whatever the
// umask (it is the merged root's, which the task's user must be able to enter).
Status make_overlay_dirs(const OverlayRoot& o);

}  // namespace weft::agent
