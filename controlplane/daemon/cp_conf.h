// weft-controlplane configuration (/etc/weft/controlplane.toml).
#pragma once

#include <cstdint>
#include <string>

#include "common/registry.h"
#include "common/result.h"
#include "common/tls.h"
#include "controlplane/api/access.h"
#include "controlplane/machines/broker.h"
#include "controlplane/region/region.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/etcd_store.h"

namespace weft::cp {

// Where the state lives ([store]): "sqlite" in state_dir (one control plane), or
// "etcd" (several replicas, one leading: docs/replicas.md).
struct StoreConfig {
  std::string kind = "sqlite";
  EtcdStoreConfig etcd;     // endpoints, TLS files, prefix, max_txn_ops, timeout
  int64_t lease_ttl_s = 2;  // the leader's lease: a dead leader is replaced within it
  std::string advertise;    // this replica's address as followers name it (default: listen)
};

struct CpConfig {
  std::string socket = "/run/weft/controlplane.sock";  // operators (weftctl) and local machines
  // Service discovery (docs/services.md): how long a stop waits for every agent that
  // answers DNS to acknowledge its task's withdrawal before it goes ahead (logged), and
  // whether stops wait at all (false: a task leaves discovery as its stop is sent, as
  // in most schedulers; for comparisons).
  uint64_t discovery_ack_timeout_us = 5'000'000;
  bool discovery_withdraw = true;
  // Autoscaling (docs/jobs.md): how often autoscaled jobs' usage is asked of the agents
  // and decided on.
  uint64_t autoscale_interval_us = 15'000'000;
  // The ReBalancer (docs/rebalancer.md, [rebalancer]): its rounds, and how many moves it
  // may make in one entitlement in a round and in an hour.
  struct Rebalancer {
    bool enabled = true;
    uint64_t interval_us = 60'000'000;
    int64_t moves_per_round = 5;
    int64_t moves_per_hour = 30;
    // A move its job's TaskController has not acknowledged this long is withdrawn.
    uint64_t move_timeout_us = 600'000'000;
  } rebalancer;
  std::string socket_group = "weft";
  std::string listen = "127.0.0.1:7070";  // machines' sessions ("" = Unix socket only)
  bool insecure_listen = false;           // plaintext off loopback (tests only)
  // Mutual TLS on `listen` (tls_ca, tls_cert, tls_key, tls_crl): every machine and
  // operator session presents a certificate from the CA bundle.
  tls::Config tls;
  // TLS session resumption for reconnecting machines (a ticket key in state_dir, new at
  // every reload so that a revocation ends every ticket).
  bool tls_resumption = true;
  // The key file that seals jobs' secret values (task.env, task.files[].content) in the
  // store (common/secret_box.h); "" = written as they are.
  std::string secrets_key;
  // Which certificates are machines, viewers, operators and admins ([access]).
  AccessConfig access;
  std::string state_dir = "/var/lib/weft/controlplane";
  BrokerConfig broker;
  SchedulerLimits limits;
  // Machines going down (dead or failed): their tasks are replaced at once while this
  // budget lasts, counted in fault domains (the machines of one domain that go down in
  // the same tick take one token) rather than in tasks. The burst is a share of the
  // fleet (at least 20 domains); then `machine_failures_per_min`. Beyond it, what is
  // left waits in order.
  double machine_failures_per_min = 60;
  double machine_failures_burst = 0.01;  // of the registered machines
  // The circuit breaker: when more than this share of the fleet is down at once, the
  // control plane's own view is suspect (its network, its host) and nothing is
  // replaced for machines that go down until the share drops again (logged each tick).
  double failure_breaker = 0.3;
  // Ended tasks stay listed (job show) this long, then are forgotten for good.
  uint64_t ended_task_retention_us = 10ull * 60 * 1'000'000;
  std::string log_level = "info";
  // Prometheus /metrics (docs/metrics.md): loopback by default; "" = none.
  std::string metrics_listen = "127.0.0.1:9470";
  // The read-only web view over plain HTTP (docs/web-view.md): a loopback address only
  // (reach it through an SSH tunnel); "" = none. Viewers with a certificate use
  // `weftctl web` over mutual TLS instead.
  std::string web_listen;
  // The host names the web view answers for (the Host header, port aside): localhost,
  // 127.0.0.1, [::1] and web_listen's address by default; a name a tunnel or proxy uses
  // must be added. Any other name is refused (DNS rebinding).
  std::vector<std::string> web_hosts;
  StoreConfig store;
  // [region] (docs/regions.md): the role of this process in a region of shards and front
  // ends; all-in-one (the whole control plane, today's default) unless set.
  RegionConfig region;
  // [images] (docs/images.md): the registries a job's image tag is resolved at, once,
  // when the job is created or updated.
  registry::Config registry;
};

Result<CpConfig> parse_cp_config(const std::string& text, const std::string& name);
Result<CpConfig> load_cp_config(const std::string& path);

// Where other control planes and clients reach this one: store.advertise, else listen.
inline std::string advertised(const CpConfig& cfg) {
  return !cfg.store.advertise.empty() ? cfg.store.advertise : cfg.listen;
}

}  // namespace weft::cp
