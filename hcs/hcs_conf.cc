#include "hcs/hcs_conf.h"

#include "common/config.h"
#include "common/cp_link.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/units.h"

namespace weft::hcs {

namespace {

Result<uint64_t> duration(const TomlDoc& doc, const toml::table& t, const char* key, uint64_t def,
                          uint64_t min) {
  TRY_ASSIGN(auto v, doc.get_string(t, key));
  if (!v) return def;
  auto us = parse_duration_us(*v);
  if (!us.ok() || *us < min)
    return field_error(doc.where(*t.get(key)), std::string("'") + key +
                                                   "' must be a duration of at least " +
                                                   std::to_string(min / 1000) + "ms");
  return *us;
}

Result<double> percent(const TomlDoc& doc, const toml::table& t, const char* key, double def) {
  const toml::node* n = t.get(key);
  if (!n) return def;
  double v = n->is_integer()          ? static_cast<double>(n->as_integer()->get())
             : n->is_floating_point() ? n->as_floating_point()->get()
                                      : -1;
  if (v < 0 || v > 100)
    return field_error(doc.where(*n),
                       std::string("'") + key + "' must be a percentage from 0 to 100");
  return v;
}

}  // namespace

Result<HcsConfig> parse_hcs_config(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(t, "",
                    {"socket",
                     "socket_group",
                     "state_dir",
                     "host_root",
                     "interval",
                     "kmsg",
                     "psi_degraded_pct",
                     "psi_failed_pct",
                     "disk",
                     "link",
                     "exec",
                     "hysteresis",
                     "log_level",
                     "metrics_listen",
                     "confirm_interval",
                     "psi_triggers",
                     "psi",
                     "kernel",
                     "liveness",
                     "control_plane",
                     "insecure_control_plane",
                     "machine_id"},
                    kControlPlaneTlsKeys));
  HcsConfig c;
  TRY(doc.read_strings(t, {{"socket", &c.socket},
                           {"socket_group", &c.socket_group},
                           {"state_dir", &c.state_dir},
                           {"host_root", &c.host_root},
                           {"control_plane", &c.control_plane},
                           {"machine_id", &c.machine_id},
                           {"log_level", &c.log_level}}));
  TRY(metrics::read_listen(doc, t, &c.metrics_listen));
  TRY_ASSIGN(auto insecure_cp, doc.get_bool(t, "insecure_control_plane"));
  c.insecure_control_plane = insecure_cp.value_or(false);
  TRY(read_control_plane_tls(doc, t, &c.control_plane_tls));
  TRY(check_control_plane_endpoint(
      c.control_plane, t.get("control_plane") ? doc.where(*t.get("control_plane")) : name,
      c.insecure_control_plane, c.control_plane_tls.files.enabled()));
  TRY_ASSIGN(c.interval_us, duration(doc, t, "interval", c.interval_us, 100'000));
  TRY_ASSIGN(c.confirm_interval_us,
             duration(doc, t, "confirm_interval", c.confirm_interval_us, 100'000));
  TRY_ASSIGN(auto kmsg, doc.get_bool(t, "kmsg"));
  c.kmsg = kmsg.value_or(true);
  TRY_ASSIGN(auto trig, doc.get_bool(t, "psi_triggers"));
  c.psi_triggers = trig.value_or(true);
  TRY_ASSIGN(auto psi, doc.get_string_list(t, "psi"));
  if (psi) {
    c.psi.clear();
    for (const auto& r : *psi) {
      if (r != "cpu" && r != "memory" && r != "io")
        return field_error(doc.where(*t.get("psi")),
                           "'psi' lists cpu, memory or io, not '" + r + "'");
      if (std::find(c.psi.begin(), c.psi.end(), r) == c.psi.end()) c.psi.push_back(r);
    }
  }
  TRY_ASSIGN(const toml::table* k, doc.get_table(t, "kernel"));
  if (k) {
    TRY(doc.only_keys(*k, "kernel.",
                      {"bpf", "oom_window", "oom_global_failed", "memcg_oom_storm_per_min",
                       "tcp_retrans_degraded_per_s", "drops_degraded_per_s"}));
    TRY_ASSIGN(auto bpf, doc.get_bool(*k, "bpf"));
    c.kernel.bpf = bpf.value_or(true);
    TRY_ASSIGN(c.kernel.oom_window_us,
               duration(doc, *k, "oom_window", c.kernel.oom_window_us, 1'000'000));
    for (auto [key, out] : {std::pair{"oom_global_failed", &c.kernel.oom_global_failed},
                            {"memcg_oom_storm_per_min", &c.kernel.memcg_oom_storm_per_min}}) {
      TRY_ASSIGN(auto v, doc.get_int(*k, key));
      if (!v) continue;
      if (*v < 1 || *v > 10'000'000)
        return field_error(doc.where(*k->get(key)),
                           std::string("'") + key + "' must be 1..10000000");
      *out = static_cast<int>(*v);
    }
    for (auto [key, out] :
         {std::pair{"tcp_retrans_degraded_per_s", &c.kernel.tcp_retrans_degraded_per_s},
          {"drops_degraded_per_s", &c.kernel.drops_degraded_per_s}}) {
      const toml::node* n = k->get(key);
      if (!n) continue;
      double v = n->is_integer()          ? static_cast<double>(n->as_integer()->get())
                 : n->is_floating_point() ? n->as_floating_point()->get()
                                          : -1;
      if (v <= 0)
        return field_error(doc.where(*n), std::string("'") + key + "' must be a positive number");
      *out = v;
    }
  }
  TRY_ASSIGN(const toml::table* lv, doc.get_table(t, "liveness"));
  if (lv) {
    TRY(doc.only_keys(*lv, "liveness.", {"agent_socket", "sidekick_socket", "timeout"}));
    for (auto [key, out] :
         {std::pair{"agent_socket", &c.agent_socket}, {"sidekick_socket", &c.sidekick_socket}}) {
      TRY_ASSIGN(auto v, doc.get_string(*lv, key));
      if (!v) continue;
      if (!v->empty() && (*v)[0] != '/')
        return field_error(doc.where(*lv->get(key)),
                           std::string("'") + key + "' must be an absolute path or \"\" (off)");
      *out = *v;
    }
    TRY_ASSIGN(auto to, duration(doc, *lv, "timeout", 2'000'000, 10'000));
    c.liveness_timeout_ms = static_cast<int>(to / 1000);
  }
  TRY_ASSIGN(c.psi_degraded_pct, percent(doc, t, "psi_degraded_pct", c.psi_degraded_pct));
  TRY_ASSIGN(c.psi_failed_pct, percent(doc, t, "psi_failed_pct", c.psi_failed_pct));
  if (const toml::node* n = t.get("disk")) {
    const toml::array* arr = n->as_array();
    if (!arr) return field_error(doc.where(*n), "'disk' must be a list of [[disk]] tables");
    c.disks.clear();
    for (const auto& e : *arr) {
      const toml::table* d = e.as_table();
      if (!d) return field_error(doc.where(e), "each [[disk]] must be a table");
      TRY(doc.only_keys(*d, "disk.", {"path", "min_free_pct", "min_inodes_pct"}));
      DiskCheck dc;
      TRY_ASSIGN(auto path, doc.get_string(*d, "path"));
      if (!path || path->empty() || (*path)[0] != '/')
        return field_error(doc.where(e), "[[disk]] needs an absolute 'path'");
      dc.path = *path;
      TRY_ASSIGN(dc.min_free_pct, percent(doc, *d, "min_free_pct", dc.min_free_pct));
      TRY_ASSIGN(dc.min_inodes_pct, percent(doc, *d, "min_inodes_pct", dc.min_inodes_pct));
      c.disks.push_back(dc);
    }
  }
  if (const toml::node* n = t.get("link")) {
    const toml::array* arr = n->as_array();
    if (!arr) return field_error(doc.where(*n), "'link' must be a list of interface names");
    for (const auto& e : *arr) {
      if (!e.is_string() || e.as_string()->get().empty())
        return field_error(doc.where(e), "link names must be strings");
      c.links.push_back(e.as_string()->get());
    }
  }
  if (const toml::node* n = t.get("exec")) {
    const toml::array* arr = n->as_array();
    if (!arr) return field_error(doc.where(*n), "'exec' must be a list of [[exec]] tables");
    for (const auto& e : *arr) {
      const toml::table* x = e.as_table();
      if (!x) return field_error(doc.where(e), "each [[exec]] must be a table");
      TRY(doc.only_keys(*x, "exec.", {"name", "command", "timeout"}));
      ExecCheck ec;
      TRY_ASSIGN(auto nm, doc.get_string(*x, "name"));
      if (!nm || nm->empty()) return field_error(doc.where(e), "[[exec]] needs a 'name'");
      ec.name = *nm;
      const toml::array* cmd = x->get("command") ? x->get("command")->as_array() : nullptr;
      if (!cmd || cmd->empty())
        return field_error(doc.where(e), "[[exec]] needs 'command' = [\"program\", \"args\"...]");
      for (const auto& a : *cmd) {
        if (!a.is_string()) return field_error(doc.where(a), "command arguments must be strings");
        ec.command.push_back(a.as_string()->get());
      }
      TRY_ASSIGN(ec.timeout_us, duration(doc, *x, "timeout", ec.timeout_us, 100'000));
      c.execs.push_back(ec);
    }
  }
  TRY_ASSIGN(const toml::table* h, doc.get_table(t, "hysteresis"));
  if (h) {
    TRY(doc.only_keys(*h, "hysteresis.",
                      {"fail_after", "recover_after", "hold_down", "flap_limit", "flap_window"}));
    for (auto [key, out] : {std::pair{"fail_after", &c.hysteresis.fail_after},
                            {"recover_after", &c.hysteresis.recover_after},
                            {"flap_limit", &c.hysteresis.flap_limit}}) {
      TRY_ASSIGN(auto v, doc.get_int(*h, key));
      if (v) {
        if (*v < 1 || *v > 1000)
          return field_error(doc.where(*h->get(key)), std::string("'") + key + "' must be 1..1000");
        *out = static_cast<int>(*v);
      }
    }
    TRY_ASSIGN(c.hysteresis.hold_down_us,
               duration(doc, *h, "hold_down", c.hysteresis.hold_down_us, 0));
    TRY_ASSIGN(c.hysteresis.flap_window_us,
               duration(doc, *h, "flap_window", c.hysteresis.flap_window_us, 1'000'000));
  }
  for (auto [key, val] : {std::pair{"socket", &c.socket}, {"state_dir", &c.state_dir}})
    if (val->empty() || (*val)[0] != '/')
      return field_error(t.get(key) ? doc.where(*t.get(key)) : name,
                         std::string("'") + key + "' must be an absolute path");
  if (!log_level_name_valid(c.log_level))
    return field_error(t.get("log_level") ? doc.where(*t.get("log_level")) : name,
                       "'log_level' must be debug, info, warning or error");
  if (c.psi_failed_pct < c.psi_degraded_pct)
    return field_error(name, "'psi_failed_pct' must be at least 'psi_degraded_pct'");
  return c;
}

Result<HcsConfig> load_hcs_config(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse_hcs_config(text, path);
}

}  // namespace weft::hcs
