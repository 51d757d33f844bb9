#include "controlplane/daemon/cp_conf.h"

#include <tuple>

#include "common/config.h"
#include "common/cp_link.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/rpc/endpoint.h"
#include "common/units.h"
#include "controlplane/region/region.h"

namespace weft::cp {

namespace {

Status parse_store(const TomlDoc& doc, const toml::table& t, const std::string& name, CpConfig* c) {
  TRY(doc.only_keys(t, "store",
                    {"kind", "etcd_endpoints", "etcd_prefix", "etcd_ca", "etcd_cert", "etcd_key",
                     "etcd_timeout", "etcd_max_txn_ops", "lease_ttl", "advertise"}));
  StoreConfig& s = c->store;
  auto where = [&](const char* key) { return t.get(key) ? doc.where(*t.get(key)) : name; };
  TRY_ASSIGN(auto kind, doc.get_string(t, "kind"));
  if (kind) s.kind = *kind;
  if (s.kind != "sqlite" && s.kind != "etcd")
    return field_error(where("kind"), "'kind' must be \"sqlite\" or \"etcd\"");
  TRY(doc.read_strings(t, {{"etcd_prefix", &s.etcd.prefix},
                           {"etcd_ca", &s.etcd.etcd.ca},
                           {"etcd_cert", &s.etcd.etcd.cert},
                           {"etcd_key", &s.etcd.etcd.key},
                           {"advertise", &s.advertise}}));
  TRY_ASSIGN(auto eps, doc.get_string_list(t, "etcd_endpoints"));
  if (eps) s.etcd.etcd.endpoints = *eps;
  if (s.kind == "etcd" && s.etcd.etcd.endpoints.empty())
    return field_error(where("etcd_endpoints"),
                       "'etcd_endpoints' must list the etcd members (\"https://host:2379\")");
  for (const auto& e : s.etcd.etcd.endpoints) {
    bool https = e.rfind("https://", 0) == 0;
    if (!https && e.rfind("http://", 0) != 0)
      return field_error(where("etcd_endpoints"), "'" + e + "' must be an http:// or https:// URL");
    if (https && s.etcd.etcd.ca.empty())
      return field_error(where("etcd_endpoints"), "an https:// member needs 'etcd_ca'");
  }
  if (s.etcd.etcd.cert.empty() != s.etcd.etcd.key.empty())
    return field_error(where(s.etcd.etcd.cert.empty() ? "etcd_key" : "etcd_cert"),
                       "'etcd_cert' and 'etcd_key' go together");
  if (s.etcd.prefix.empty() || s.etcd.prefix[0] != '/' || s.etcd.prefix.back() != '/')
    return field_error(where("etcd_prefix"), "'etcd_prefix' must start and end with /");
  TRY_ASSIGN(auto ttl, doc.get_string(t, "lease_ttl"));
  if (ttl) {
    auto us = parse_duration_us(*ttl);
    if (!us.ok() || *us < 2'000'000 || *us > 60'000'000 || *us % 1'000'000 != 0)
      return field_error(where("lease_ttl"), "'lease_ttl' must be whole seconds from 2s to 60s");
    s.lease_ttl_s = static_cast<int64_t>(*us / 1'000'000);
  }
  TRY_ASSIGN(auto timeout, doc.get_string(t, "etcd_timeout"));
  if (timeout) {
    auto us = parse_duration_us(*timeout);
    if (!us.ok() || *us < 100'000 || *us > 60'000'000)
      return field_error(where("etcd_timeout"), "'etcd_timeout' must be 100ms to 60s");
    s.etcd.etcd.timeout_ms = *us / 1000;
  }
  TRY_ASSIGN(auto ops, doc.get_int(t, "etcd_max_txn_ops"));
  if (ops) {
    if (*ops < 8 || *ops > 1'000'000)
      return field_error(where("etcd_max_txn_ops"),
                         "'etcd_max_txn_ops' must be 8 to 1000000 (etcd's --max-txn-ops)");
    s.etcd.max_txn_ops = static_cast<size_t>(*ops);
  }
  if (!s.advertise.empty()) {
    auto ep = rpc::parse_endpoint(s.advertise);
    if (!ep.ok() || ep->is_unix)
      return field_error(where("advertise"), "'advertise' must be host:port");
  }
  return {};
}

Status parse_region(const TomlDoc& doc, const toml::table& t, const std::string& name,
                    CpConfig* c) {
  TRY(doc.only_keys(t, "region.",
                    {"role", "shard", "group", "prefix", "shards", "brokers", "return_idle"}));
  RegionConfig& r = c->region;
  auto where = [&](const char* key) { return t.get(key) ? doc.where(*t.get(key)) : name; };
  TRY_ASSIGN(auto role, doc.get_string(t, "role"));
  if (role) {
    if (*role == "shard")
      r.role = RegionRole::kShard;
    else if (*role == "front-end")
      r.role = RegionRole::kFrontEnd;
    else if (*role == "broker")
      r.role = RegionRole::kBroker;
    else if (*role != "all-in-one")
      return field_error(where("role"),
                         "'role' must be \"all-in-one\", \"broker\", \"shard\" or \"front-end\"");
  }
  TRY_ASSIGN(auto shard, doc.get_string(t, "shard"));
  if (shard) {
    TRY(check_shard_id(where("shard"), *shard));
    r.shard = *shard;
  }
  TRY_ASSIGN(auto prefix, doc.get_string(t, "prefix"));
  if (prefix) r.prefix = *prefix;
  if (r.prefix.size() < 2 || r.prefix[0] != '/' || r.prefix.back() != '/')
    return field_error(where("prefix"), "'prefix' must start and end with /");
  TRY_ASSIGN(const toml::table* shards, doc.get_table(t, "shards"));
  if (shards) {
    for (const auto& [key, node] : *shards) {
      std::string id(key.str());
      TRY(check_shard_id(doc.where(node), id));
      const auto* eps = node.as_string();
      if (!eps || eps->get().empty())
        return field_error(doc.where(node), "'region.shards." + id +
                                                "' must list the shard's replicas "
                                                "(\"tls://host:7070,tls://host2:7070\")");
      for (const auto& ep : split_endpoints(eps->get()))
        if (auto e = rpc::parse_endpoint(ep); !e.ok())
          return field_error(doc.where(node), "'" + ep + "': " + e.error().message);
      r.shards[id] = eps->get();
    }
  }
  TRY_ASSIGN(auto group, doc.get_string(t, "group"));
  if (group) {
    TRY(check_shard_id(where("group"), *group));
    r.group = *group;
  }
  // `brokers = "endpoints"` (one group, "default"), or [region.brokers] (group =
  // "endpoints", a group a datacenter).
  auto broker_group = [&](const std::string& id, const std::string& eps,
                          const std::string& at) -> Status {
    if (split_endpoints(eps).empty())
      return field_error(at, "'region.brokers' must list each broker group's replicas");
    for (const auto& ep : split_endpoints(eps))
      if (auto e = rpc::parse_endpoint(ep); !e.ok())
        return field_error(at, "'" + ep + "': " + e.error().message);
    r.brokers[id] = eps;
    return {};
  };
  if (const toml::node* b = t.get("brokers")) {
    if (const auto* one = b->as_string()) {
      TRY(broker_group("default", one->get(), where("brokers")));
    } else if (const auto* groups = b->as_table()) {
      if (groups->empty())
        return field_error(where("brokers"), "[region.brokers] must name at least one group");
      for (const auto& [key, node] : *groups) {
        std::string id(key.str());
        TRY(check_shard_id(doc.where(node), id));
        const auto* eps = node.as_string();
        if (!eps)
          return field_error(doc.where(node), "'region.brokers." + id +
                                                  "' must list the group's replicas "
                                                  "(\"tls://b1:7070,tls://b2:7070\")");
        TRY(broker_group(id, eps->get(), doc.where(node)));
      }
    } else {
      return field_error(where("brokers"),
                         "'brokers' must be the brokers' replicas (\"a:7070,b:7070\") or a "
                         "table of broker groups ([region.brokers] dc1 = \"...\")");
    }
  }
  TRY_ASSIGN(auto idle, doc.get_string(t, "return_idle"));
  if (idle) {
    auto us = parse_duration_us(*idle);
    if (!us.ok() || *us < 100'000 || *us > 86400'000'000ull)
      return field_error(where("return_idle"),
                         "'return_idle' must be a duration from 100ms to 24h");
    r.return_idle_us = *us;
  }
  if (r.role == RegionRole::kAllInOne) return {};
  if (c->store.kind != "etcd")
    return field_error(where("role"), std::string("a ") + region_role_name(r.role) +
                                          " keeps the region's records in etcd: [store] "
                                          "kind = \"etcd\" is required");
  if (r.role == RegionRole::kShard) {
    if (r.shard.empty()) return field_error(where("role"), "a shard needs 'shard' (its id)");
    const std::string& sp = c->store.etcd.prefix;
    if (sp.rfind(r.prefix, 0) == 0 || r.prefix.rfind(sp, 0) == 0)
      return field_error(where("prefix"),
                         "the shard's [store] etcd_prefix and the region's prefix must not "
                         "contain one another (each shard keeps its state under its own)");
  }
  if (r.role == RegionRole::kBroker && r.shards.empty())
    return field_error(where("role"),
                       "a broker needs [region.shards] (id = \"endpoints\"): it "
                       "sends each lent machine to its shard");
  if (r.role == RegionRole::kBroker) {
    const std::string& sp = c->store.etcd.prefix;
    if (sp.rfind(r.prefix, 0) == 0 || r.prefix.rfind(sp, 0) == 0)
      return field_error(where("prefix"),
                         "the broker's [store] etcd_prefix and the region's prefix must not "
                         "contain one another");
  }
  if (r.role == RegionRole::kFrontEnd && r.shards.empty())
    return field_error(where("role"), "a front end needs [region.shards] (id = \"endpoints\")");
  return {};
}

// A duration key of `t` (its path `prefix` + key), within a range: its error names the
// key, the range and an example.
struct DurationRange {
  uint64_t min_us, max_us;
  const char* text;     // "1s to 10m"
  const char* example;  // "15s"
};
Status read_duration(const TomlDoc& doc, const toml::table& t, const std::string& prefix,
                     const char* key, const DurationRange& range, uint64_t* out) {
  TRY_ASSIGN(auto text, doc.get_string(t, key));
  if (!text) return {};
  auto us = parse_duration_us(*text);
  if (!us.ok() || *us < range.min_us || *us > range.max_us)
    return field_error(doc.where(*t.get(key)), "'" + prefix + key + "' must be a duration from " +
                                                   range.text + ", such as \"" + range.example +
                                                   "\"");
  *out = *us;
  return {};
}

// machine_lease and fence_after (docs/jobs.md, "At most one copy"): fence_after at least
// a heartbeat and a half (one lost answer never fences), and a second at least between
// it and the lease's end for the fenced tasks' stop.
Status read_lease(const TomlDoc& doc, const toml::table& t, BrokerConfig* b) {
  TRY(read_duration(doc, t, "", "machine_lease", {1'000'000, 600'000'000, "1s to 10m", "8s"},
                    &b->lease_us));
  TRY(read_duration(doc, t, "", "fence_after", {100'000, 600'000'000, "100ms to 10m", "4s"},
                    &b->fence_after_us));
  uint64_t lease = b->lease(), fence = b->fence_after(), beat = b->heartbeat_interval_us;
  const toml::node* at = t.get("fence_after") ? t.get("fence_after") : t.get("machine_lease");
  auto where = [&] { return at ? doc.where(*at) : doc.where(t); };
  if (fence * 2 < beat * 3)
    return field_error(where(), "'fence_after' must be at least a heartbeat interval and a half (" +
                                    std::to_string(beat * 3 / 2000) + " ms)");
  if (fence + 1'000'000 > lease)
    return field_error(where(), "'fence_after' must end at least 1s before 'machine_lease' (" +
                                    std::to_string(lease / 1000) +
                                    " ms): the fenced tasks' stop needs it");
  return {};
}

Status read_rebalancer(const TomlDoc& doc, const toml::table& t, CpConfig::Rebalancer* r) {
  TRY(doc.only_keys(t, "rebalancer.",
                    {"enabled", "interval", "moves_per_round", "moves_per_hour", "move_timeout"}));
  TRY_ASSIGN(auto enabled, doc.get_bool(t, "enabled"));
  r->enabled = enabled.value_or(true);
  TRY(read_duration(doc, t, "rebalancer.", "interval",
                    {1'000'000, 3600'000'000ull, "1s to 1h", "1m"}, &r->interval_us));
  TRY(read_duration(doc, t, "rebalancer.", "move_timeout",
                    {10'000'000, 3600'000'000ull, "10s to 1h", "10m"}, &r->move_timeout_us));
  for (auto [key, out, max] : {std::tuple{"moves_per_round", &r->moves_per_round, int64_t{1000}},
                               std::tuple{"moves_per_hour", &r->moves_per_hour, int64_t{100000}}}) {
    TRY_ASSIGN(auto n, doc.get_int(t, key));
    if (!n) continue;
    if (*n < 0 || *n > max)
      return field_error(doc.where(*t.get(key)), std::string("'rebalancer.") + key +
                                                     "' must be a number of moves from 0 to " +
                                                     std::to_string(max));
    *out = *n;
  }
  return {};
}

}  // namespace

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
                     "machine_lease",
                     "fence_after",
                     "failover_grace",
                     "prepare_timeout",
                     "discovery_ack_timeout",
                     "autoscale_interval",
                     "rebalancer",
                     "discovery_withdraw",
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
                     "secrets_key",
                     "metrics_listen",
                     "web_listen",
                     "web_hosts",
                     "access",
                     "images",
                     "region",
                     "store"}));
  CpConfig c;
  TRY(doc.read_strings(t, {{"socket", &c.socket},
                           {"socket_group", &c.socket_group},
                           {"listen", &c.listen},
                           {"state_dir", &c.state_dir},
                           {"log_level", &c.log_level},
                           {"tls_ca", &c.tls.ca_file},
                           {"tls_cert", &c.tls.cert_file},
                           {"tls_key", &c.tls.key_file},
                           {"tls_crl", &c.tls.crl_file}}));
  TRY(metrics::read_listen(doc, t, &c.metrics_listen));
  if (auto w = doc.get_string(t, "web_listen"); !w.ok()) {
    return std::move(w).error();
  } else if (*w) {
    // Plain HTTP without authentication: loopback only (127.0.0.0/8 or [::1]).
    const std::string& v = **w;
    bool loopback = v.rfind("127.", 0) == 0 || v.rfind("[::1]:", 0) == 0;
    if (!loopback || !metrics::check_listen(v).ok() || v.front() == '/')
      return field_error(doc.where(*t.get("web_listen")),
                         "'web_listen' must be a loopback address and port (127.0.0.1:9480 or "
                         "[::1]:9480): the web view has no authentication of its own");
    c.web_listen = v;
    c.web_hosts = {"localhost", "127.0.0.1", "[::1]", v.substr(0, v.rfind(':'))};
  }
  TRY_ASSIGN(auto hosts, doc.get_string_list(t, "web_hosts"));
  if (hosts) {
    for (const auto& h : *hosts)
      if (h.empty() || h.size() > 253 ||
          h.find_first_not_of(
              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-[]:") !=
              std::string::npos)
        return field_error(doc.where(*t.get("web_hosts")),
                           "'web_hosts' must list host names or addresses (without a port)");
    c.web_hosts.insert(c.web_hosts.end(), hosts->begin(), hosts->end());
  }
  if (!c.tls.ca_file.empty() || !c.tls.cert_file.empty() || !c.tls.key_file.empty())
    for (auto [key, v] : {std::pair{"tls_ca", &c.tls.ca_file},
                          {"tls_cert", &c.tls.cert_file},
                          {"tls_key", &c.tls.key_file}})
      if (v->empty())
        return field_error(name, std::string("'") + key + "' is required with the other tls_ keys");
  TRY_ASSIGN(const toml::table* images, doc.get_table(t, "images"));
  if (images) {
    TRY(doc.only_keys(*images, "images.", {}, registry::kRegistryConfigKeys));
    TRY(registry::read_registry_config(doc, *images, &c.registry));
  }
  TRY_ASSIGN(const toml::table* access, doc.get_table(t, "access"));
  TRY_ASSIGN(c.access, parse_access(doc, access));
  TRY_ASSIGN(auto secrets, doc.get_string(t, "secrets_key"));
  if (secrets) {
    if (secrets->empty() || (*secrets)[0] != '/')
      return field_error(doc.where(*t.get("secrets_key")),
                         "'secrets_key' must be an absolute path (a key file: docs/security.md)");
    c.secrets_key = *secrets;
  }
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
  TRY_ASSIGN(auto grace, doc.get_string(t, "failover_grace"));
  if (grace) {
    auto us = parse_duration_us(*grace);
    if (!us.ok() || *us > 3600'000'000ull)
      return field_error(doc.where(*t.get("failover_grace")),
                         "'failover_grace' must be a duration of at most 1h, such as \"60s\"");
    c.broker.failover_grace_us = *us;
  }
  TRY(read_duration(doc, t, "", "prepare_timeout", {1'000'000, 3600'000'000ull, "1s to 1h", "2m"},
                    &c.broker.prepare_timeout_us));
  TRY(read_duration(doc, t, "", "discovery_ack_timeout",
                    {100'000, 600'000'000, "100ms to 10m", "5s"}, &c.discovery_ack_timeout_us));
  TRY(read_duration(doc, t, "", "autoscale_interval", {1'000'000, 600'000'000, "1s to 10m", "15s"},
                    &c.autoscale_interval_us));
  TRY_ASSIGN(const toml::table* rebalancer, doc.get_table(t, "rebalancer"));
  if (rebalancer) TRY(read_rebalancer(doc, *rebalancer, &c.rebalancer));
  TRY_ASSIGN(auto withdraw, doc.get_bool(t, "discovery_withdraw"));
  if (withdraw) c.discovery_withdraw = *withdraw;
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
  TRY(read_lease(doc, t, &c.broker));
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
  TRY_ASSIGN(const toml::table* store, doc.get_table(t, "store"));
  if (store) TRY(parse_store(doc, *store, name, &c));
  TRY_ASSIGN(const toml::table* region, doc.get_table(t, "region"));
  if (region) TRY(parse_region(doc, *region, name, &c));
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
