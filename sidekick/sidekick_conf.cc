#include "sidekick/sidekick_conf.h"

#include "common/config.h"
#include "common/cp_link.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/paths.h"
#include "common/units.h"

namespace weft::sidekick {

Result<SidekickConfig> parse_sidekick_config(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(
      t, "",
      {"socket", "socket_group", "state_dir", "profile_dirs", "workload_cgroup", "host_root",
       "verify_interval", "drift_policy", "apply_on_start", "log_level", "metrics_listen",
       "control_plane", "insecure_control_plane", "machine_id", "allow_reboot"},
      kControlPlaneTlsKeys));
  SidekickConfig c;
  auto at = [&](const char* key) { return t.get(key) ? doc.where(*t.get(key)) : name; };
  TRY(doc.read_strings(t, {{"socket", &c.socket},
                           {"socket_group", &c.socket_group},
                           {"state_dir", &c.state_dir},
                           {"workload_cgroup", &c.workload_cgroup},
                           {"host_root", &c.host_root},
                           {"control_plane", &c.control_plane},
                           {"machine_id", &c.machine_id},
                           {"log_level", &c.log_level}}));
  TRY(metrics::read_listen(doc, t, &c.metrics_listen));

  if (const toml::node* n = t.get("profile_dirs")) {
    const toml::array* arr = n->as_array();
    if (!arr || arr->empty())
      return field_error(doc.where(*n), "'profile_dirs' must be a non-empty list of directories");
    c.profile_dirs.clear();
    for (const auto& e : *arr) {
      if (!e.is_string() || e.as_string()->get().empty() || e.as_string()->get()[0] != '/')
        return field_error(doc.where(e), "'profile_dirs' entries must be absolute paths");
      c.profile_dirs.push_back(e.as_string()->get());
    }
  }
  TRY_ASSIGN(auto interval, doc.get_string(t, "verify_interval"));
  if (interval) {
    auto us = parse_duration_us(*interval);
    if (!us.ok() || *us < 1'000'000)
      return field_error(at("verify_interval"),
                         "'verify_interval' must be a duration of at least 1s");
    c.verify_interval_us = *us;
  }
  TRY_ASSIGN(auto policy, doc.get_string(t, "drift_policy"));
  if (policy) {
    if (*policy != "report" && *policy != "enforce")
      return field_error(at("drift_policy"), "'drift_policy' must be \"report\" or \"enforce\"");
    c.enforce_drift = *policy == "enforce";
  }
  TRY_ASSIGN(auto allow_reboot, doc.get_bool(t, "allow_reboot"));
  if (allow_reboot) c.allow_reboot = *allow_reboot;
  TRY_ASSIGN(auto insecure_cp, doc.get_bool(t, "insecure_control_plane"));
  c.insecure_control_plane = insecure_cp.value_or(false);
  TRY(read_control_plane_tls(doc, t, &c.control_plane_tls));
  TRY(check_control_plane_endpoint(c.control_plane, at("control_plane"), c.insecure_control_plane,
                                   c.control_plane_tls.files.enabled()));
  TRY_ASSIGN(auto aos, doc.get_bool(t, "apply_on_start"));
  if (aos) c.apply_on_start = *aos;
  for (auto [key, val] : {std::pair{"socket", &c.socket}, {"state_dir", &c.state_dir}}) {
    if (val->empty() || (*val)[0] != '/')
      return field_error(at(key), std::string("'") + key + "' must be an absolute path");
  }
  if (c.workload_cgroup.rfind("systemd:", 0) != 0 &&
      (c.workload_cgroup.empty() || c.workload_cgroup[0] != '/'))
    return field_error(at("workload_cgroup"),
                       "'workload_cgroup' must be an absolute path or systemd:<path>");
  if (!log_level_name_valid(c.log_level))
    return field_error(at("log_level"), "'log_level' must be debug, info, warning or error");
  return c;
}

Result<SidekickConfig> load_sidekick_config(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse_sidekick_config(text, path);
}

Status resolve_sidekick_config(SidekickConfig* cfg) {
  cfg->machine_id = resolve_machine_id(cfg->machine_id, cfg->host_root);
  if (cfg->workload_cgroup.rfind("systemd:", 0) == 0) {
    TRY_ASSIGN(std::string mount, HostPaths(cfg->host_root).cgroup2_mount());
    std::string rel = cfg->workload_cgroup.substr(8);
    while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
    cfg->workload_cgroup = mount + (rel.empty() ? "" : "/" + rel);
  }
  return {};
}

}  // namespace weft::sidekick
