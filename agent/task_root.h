// What a task's root and files are made of: an image's overlay, the host paths a bind
// mount may use, the spec's files in a sealed memfd, and the spec an image's config
// completes.
#pragma once

#include <string>
#include <vector>

#include "common/fs.h"
#include "common/result.h"
#include "common/task_spec.h"

namespace weft::agent {

// A task's root made from an image: an overlay of `lower` (layer directories relative to
// `layers_root`, top-most first) with `upper` and `work`, mounted by weft-init on
// `rootfs` inside the task's mount namespace.
// The host path a bind mount may use: `source` with every symlink resolved, when it
// is one of `allowed` (resolved too) or under one. Errors name mounts[i].source.
Result<std::string> allowed_bind_source(const std::string& source,
                                        const std::vector<std::string>& allowed, size_t index);
// The spec's files' contents, one after another, in a sealed memfd (never on disk).
Result<Fd> files_memfd(const TaskSpec& spec);

struct OverlayRoot {
  std::string layers_root;
  std::vector<std::string> lower;
  std::string upper, work, rootfs;
};

// The spec a task with an image runs: the image config's entrypoint and cmd (when the
// spec has no argv), env (under the spec's), working directory (when the spec has no
// cwd) and user (when the spec has none).
TaskSpec apply_image_defaults(const TaskSpec& spec, const std::vector<std::string>& entrypoint,
                              const std::vector<std::string>& cmd,
                              const std::vector<std::string>& env, const std::string& workdir,
                              const std::string& user);

}  // namespace weft::agent
