#include "agent/init/argv.h"

#include <cstdio>
#include <map>

namespace weft::agent {

std::vector<std::string> init_argv(const TaskSpec& spec, const Identity& id,
                                   const std::variant<InitStart, InitJoin>& call) {
  const auto* start = std::get_if<InitStart>(&call);
  std::vector<std::string> a = {"weft-init"};
  if (start)
    a.insert(a.end(), {"--task-dir-fd", "3", "--incarnation", std::to_string(start->incarnation)});
  else
    a.insert(a.end(), {"--join-pid", std::to_string(std::get<InitJoin>(call).pid)});
  if (id.set) {
    if (id.uid >= 0) a.insert(a.end(), {"--uid", std::to_string(id.uid)});
    if (id.gid >= 0) a.insert(a.end(), {"--gid", std::to_string(id.gid)});
    std::string g;
    for (gid_t x : id.groups) g += (g.empty() ? "" : ",") + std::to_string(x);
    if (!g.empty()) a.insert(a.end(), {"--groups", g});
  }
  a.insert(a.end(), {"--cwd", spec.cwd.empty() ? std::string("/") : spec.cwd});
  std::map<std::string, std::string> env = spec.env;
  env.emplace("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  if (!start) {
    // A joined command enters the task's namespaces and root as they are.
    const auto& join = std::get<InitJoin>(call);
    if (spec.seccomp_unconfined) a.push_back("--seccomp-unconfined");
    if (join.tty) a.push_back("--tty");
    for (const auto& [k, v] : join.env_defaults) env.emplace(k, v);
    for (const auto& [k, v] : env) a.insert(a.end(), {"--env", k + "=" + v});
    a.push_back("--");
    a.insert(a.end(), join.command.begin(), join.command.end());
    return a;
  }
  if (!spec.hostname.empty()) a.insert(a.end(), {"--hostname", spec.hostname});
  if (const OverlayRoot* overlay = start->overlay) {
    std::string lower;
    for (const auto& l : overlay->lower) lower += (lower.empty() ? "" : ":") + l;
    a.insert(a.end(), {"--rootfs", overlay->rootfs, "--overlay-layers", overlay->layers_root,
                       "--overlay-lower", lower, "--overlay-upper", overlay->upper,
                       "--overlay-work", overlay->work});
  } else if (!spec.rootfs.empty()) {
    a.insert(a.end(), {"--rootfs", spec.rootfs});
  } else if (spec.ns.pid && spec.ns.mount) {
    a.push_back("--proc");
  }
  if (!start->overlay && spec.rootfs.empty() && spec.ns.mount) a.push_back("--private-mounts");
  size_t b = 0;
  for (const auto& m : spec.mounts) {
    if (m.kind == MountKind::kBind) {
      std::string src = b < start->bind_sources.size() ? start->bind_sources[b] : m.source;
      ++b;
      a.insert(a.end(), {"--bind", std::string(m.readonly ? "ro:" : "rw:") + src + ":" + m.target});
    } else {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%o", m.mode);
      a.insert(a.end(), {"--tmpfs", std::to_string(m.size) + ":" + mode + ":" +
                                        (m.readonly ? "ro" : "rw") + ":" + m.target});
    }
  }
  for (const auto& f : spec.files) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%o", f.mode);
    a.insert(a.end(),
             {"--file", std::string(mode) + ":" + std::to_string(f.content.size()) + ":" + f.path});
  }
  if (spec.seccomp_unconfined) a.push_back("--seccomp-unconfined");
  if (spec.ns.own_network() && !start->lo_up) a.push_back("--lo");
  a.insert(a.end(), {"--log-max-bytes", std::to_string(spec.logs.max_file_bytes), "--log-max-files",
                     std::to_string(spec.logs.max_files)});
  if (!start->journal_fields.empty() && !start->journal_socket.empty())
    a.insert(a.end(), {"--journal-socket", start->journal_socket});
  for (const auto& f : start->journal_fields) a.insert(a.end(), {"--journal-field", f});
  if (!spec.hostname.empty()) env.emplace("HOSTNAME", spec.hostname);
  for (const auto& [k, v] : env) a.insert(a.end(), {"--env", k + "=" + v});
  a.push_back("--");
  a.insert(a.end(), spec.argv.begin(), spec.argv.end());
  return a;
}

}  // namespace weft::agent
