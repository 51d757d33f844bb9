#include "controlplane/cp_conf.h"

#include "common/config.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/rpc.h"

namespace weft::cp {

Result<CpConfig> parse_cp_config(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(t, "",
                    {"socket",
                     "socket_group",
                     "listen",
                     "insecure_listen",
                     "state_dir",
                     "heartbeat_interval",
                     "missed_heartbeats",
                     "destructive_per_min",
                     "destructive_burst",
                     "machine_failures_per_min",
                     "machine_failures_burst",
                     "failure_breaker",
                     "log_level",
                     "ended_task_retention",
                     "tls_ca",
                     "tls_cert",
                     "tls_key",
                     "tls_crl",
                     "tls_resumption",
                     "metrics_listen",
                     "access"}));
  CpConfig c;
  for (auto [key, out] : {std::pair{"socket", &c.socket},
                          {"socket_group", &c.socket_group},
                          {"listen", &c.listen},
                          {"state_dir", &c.state_dir},
                          {"log_level", &c.log_level},
                          {"tls_ca", &c.tls.ca_file},
                          {"tls_cert", &c.tls.cert_file},
                          {"tls_key", &c.tls.key_file},
                          {"tls_crl", &c.tls.crl_file}}) {
    TRY_ASSIGN(auto v, doc.get_string(t, key));
    if (v) *out = *v;
  }
  TRY(metrics::read_listen(doc, t, &c.metrics_listen));
  if (!c.tls.ca_file.empty() || !c.tls.cert_file.empty() || !c.tls.key_file.empty())
    for (auto [key, v] : {std::pair{"tls_ca", &c.tls.ca_file},
                          {"tls_cert", &c.tls.cert_file},
                          {"tls_key", &c.tls.key_file}})
      if (v->empty())
        return field_error(name, std::string("'") + key + "' is required with the other tls_ keys");
  TRY_ASSIGN(const toml::table* access, doc.get_table(t, "access"));
  TRY_ASSIGN(c.access, parse_access(doc, access));
  TRY_ASSIGN(auto resumption, doc.get_bool(t, "tls_resumption"));
  c.tls_resumption = resumption.value_or(true);
  TRY_ASSIGN(auto insecure, doc.get_bool(t, "insecure_listen"));
  c.insecure_listen = insecure.value_or(false);
  TRY_ASSIGN(auto hb, doc.get_string(t, "heartbeat_interval"));
  if (hb) {
    auto us = parse_duration_us(*hb);
    if (!us.ok() || *us < 100'000)
      return field_error(doc.where(*t.get("heartbeat_interval")),
                         "'heartbeat_interval' must be a duration of at least 100ms");
    c.broker.heartbeat_interval_us = *us;
  }
  TRY_ASSIGN(auto retention, doc.get_string(t, "ended_task_retention"));
  if (retention) {
    auto us = parse_duration_us(*retention);
    if (!us.ok())
      return field_error(doc.where(*t.get("ended_task_retention")),
                         "'ended_task_retention' must be a duration such as \"10m\"");
    c.ended_task_retention_us = *us;
  }
  TRY_ASSIGN(auto missed, doc.get_int(t, "missed_heartbeats"));
  if (missed) {
    if (*missed < 1 || *missed > 100)
      return field_error(doc.where(*t.get("missed_heartbeats")),
                         "'missed_heartbeats' must be 1..100");
    c.broker.missed_heartbeats = static_cast<int>(*missed);
  }
  for (auto [key, out] : {std::pair{"destructive_per_min", &c.limits.destructive_per_min},
                          {"destructive_burst", &c.limits.destructive_burst}}) {
    const toml::node* n = t.get(key);
    if (!n) continue;
    double v = n->is_integer()          ? static_cast<double>(n->as_integer()->get())
               : n->is_floating_point() ? n->as_floating_point()->get()
                                        : -1;
    if (v < 1) return field_error(doc.where(*n), std::string("'") + key + "' must be at least 1");
    *out = v;
  }
  struct Bounded {
    const char* key;
    double* out;
    double lo, hi;
    const char* what;
  };
  for (const Bounded& b : {Bounded{"machine_failures_per_min", &c.machine_failures_per_min, 0.01,
                                   1e6, "machines per minute, more than 0"},
                           Bounded{"machine_failures_burst", &c.machine_failures_burst, 0, 1,
                                   "a share of the fleet from 0 to 1"},
                           Bounded{"failure_breaker", &c.failure_breaker, 0.01, 1,
                                   "a share of the fleet from 0.01 to 1"}}) {
    const toml::node* n = t.get(b.key);
    if (!n) continue;
    double v = n->is_integer()          ? static_cast<double>(n->as_integer()->get())
               : n->is_floating_point() ? n->as_floating_point()->get()
                                        : -1;
    if (!(v >= b.lo && v <= b.hi))
      return field_error(doc.where(*n), std::string("'") + b.key + "' must be " + b.what);
    *b.out = v;
  }
  for (auto [key, val] : {std::pair{"socket", &c.socket}, {"state_dir", &c.state_dir}})
    if (val->empty() || (*val)[0] != '/')
      return field_error(t.get(key) ? doc.where(*t.get(key)) : name,
                         std::string("'") + key + "' must be an absolute path");
  if (!c.listen.empty()) {
    auto ep = rpc::parse_endpoint(c.listen);
    if (!ep.ok() || ep->is_unix)
      return field_error(t.get("listen") ? doc.where(*t.get("listen")) : name,
                         "'listen' must be host:port");
    bool loopback = ep->host == "127.0.0.1" || ep->host == "::1" || ep->host == "localhost";
    if (!loopback && !c.insecure_listen && !c.tls.enabled())
      return field_error(doc.where(*t.get("listen")),
                         "'listen' is not a loopback address: configure TLS "
                         "(tls_ca, tls_cert, "
                         "tls_key) so that sessions are encrypted and "
                         "machines authenticated, "
                         "or set insecure_listen = true (tests only)");
  }
  if (!log_level_name_valid(c.log_level))
    return field_error(t.get("log_level") ? doc.where(*t.get("log_level")) : name,
                       "'log_level' must be debug, info, warning or error");
  return c;
}

Result<CpConfig> load_cp_config(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse_cp_config(text, path);
}

}  // namespace weft::cp
