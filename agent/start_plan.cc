#include "agent/start_plan.h"

#include <sys/stat.h>

#include "common/fs.h"

namespace weft::agent {

Status admit_spec(const TaskSpec& spec, const StartPolicy& policy) {
  for (size_t i = 0; i < spec.mounts.size(); ++i)
    if (spec.mounts[i].kind == MountKind::kBind)
      TRY(allowed_bind_source(spec.mounts[i].source, policy.volume_host_paths, i));
  if (spec.seccomp_unconfined && !policy.allow_unconfined)
    return field_error("seccomp",
                       "unconfined tasks are not allowed on this machine (agent.toml: "
                       "allow_unconfined_tasks = false)");
  if (!spec.rootfs.empty()) {
    struct stat st;
    if (::stat(spec.rootfs.c_str(), &st) < 0 || !S_ISDIR(st.st_mode))
      return field_error("rootfs", "'" + spec.rootfs + "' is not a directory");
  }
  return {};
}

Result<StartPlan> plan_start(const StartInputs& in) {
  const TaskSpec& spec = *in.spec;
  StartPlan p;
  p.run_spec = spec;
  bool package_root = in.package && spec.package && spec.package->target == "/";
  if (in.image || package_root) {
    // An image task runs its image's defaults under its own spec, in an overlay root.
    const image::LocalImage& root = in.image ? *in.image : *in.package;
    if (in.image) {
      const auto& c = in.image->config;
      p.run_spec = apply_image_defaults(spec, c.entrypoint, c.cmd, c.env, c.working_dir, c.user);
    }
    if (p.run_spec.argv.empty())
      return field_error("argv", "the image names no entrypoint or cmd: the spec needs argv");
    OverlayRoot o;
    o.layers_root = in.layers_root;
    for (auto it = root.layers.rbegin(); it != root.layers.rend(); ++it) {
      o.lower.push_back(it->algorithm + "/" + it->hex);
      p.image_roots.push_back(in.layers_root + "/" + o.lower.back());
    }
    o.upper = in.task_dir + "/upper";
    o.work = in.task_dir + "/work";
    o.rootfs = in.task_dir + "/rootfs";
    // One page of mount options: overlayfs takes no more.
    size_t opts = 30 + o.upper.size() + o.work.size();
    for (const auto& l : o.lower) opts += l.size() + 1;
    if (opts >= 4096)
      return field_error("image", "has too many layers (" + std::to_string(o.lower.size()) +
                                      ") for one overlay mount on this machine");
    p.overlay = std::move(o);
  }
  for (size_t i = 0; i < p.run_spec.mounts.size(); ++i) {
    if (p.run_spec.mounts[i].kind != MountKind::kBind) continue;
    TRY_ASSIGN(std::string src,
               allowed_bind_source(p.run_spec.mounts[i].source, in.policy->volume_host_paths, i));
    p.bind_sources.push_back(src);
  }
  if (in.package && spec.package && !package_root) {
    // A package beside an image or rootfs: its shared layer, read-only, at its target.
    MountSpec m;
    m.kind = MountKind::kBind;
    m.source =
        in.layers_root + "/" + in.package->manifest.algorithm + "/" + in.package->manifest.hex;
    m.target = spec.package->target;
    m.readonly = true;
    p.run_spec.mounts.push_back(m);
    p.bind_sources.push_back(m.source);
  }
  return p;
}

Status make_overlay_dirs(const OverlayRoot& o) {
  for (const auto& d : {o.upper, o.work, o.rootfs}) TRY(mkdir_p(d, 0755));
  // The agent's unit's umask is 0027.
  if (::chmod(o.upper.c_str(), 0755) != 0) return sys_error("chmod " + o.upper);
  return {};
}

}  // namespace weft::agent
