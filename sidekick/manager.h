// weft-sidekick's manager: owns the event loop, the switch engine and the local API.
// At start it rolls back any switch a crash interrupted and re-applies the last
// committed profile (so a rebooted machine gets its profile before workloads start),
// then verifies periodically and reports (or, with drift_policy = "enforce", repairs)
// drift.
#pragma once

#include <systemd/sd-bus.h>

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/cp_link.h"
#include "common/event.h"
#include "common/link_watch.h"
#include "common/metrics.h"
#include "common/rpc/server.h"
#include "sidekick/engine.h"
#include "sidekick/sidekick_conf.h"

namespace weft::sidekick {

class Manager {
 public:
  static Result<std::unique_ptr<Manager>> create(SidekickConfig cfg);
  ~Manager();
  Status start();
  Status run() { return loop_->run(); }

 private:
  Manager(SidekickConfig cfg, std::unique_ptr<EventLoop> loop)
      : cfg_(std::move(cfg)), loop_(std::move(loop)) {}
  void register_methods();
  // The API (api.cc): one handler per method, listed in register_methods' table.
  Result<Profile> load_named(const nlohmann::json& p);  // params {"name": ...}
  Result<nlohmann::json> api_profile_ls(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_show(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_active(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_plan(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_switch(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_verify(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_off(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_import_tuned(const nlohmann::json& p,
                                                  const rpc::CallContext& c);
  Result<nlohmann::json> api_profile_history(const nlohmann::json& p, const rpc::CallContext& c);
  void schedule_verify();
  // rtnetlink link events: a link that appears (or re-appears) is checked against the
  // active profile soon after, and fixed when drift_policy = "enforce".
  Status watch_links();
  void on_link_event();
  // Drives background convergence of slow knobs once a second while any converges.
  void schedule_converge();
  void periodic_verify();
  // Verifies the active profile; with replan, plans it again (globs expanded anew, for
  // links that appeared) and applies or reports per drift_policy.
  void check_now(bool replan);
  Status check_privileged(const rpc::Peer& peer) const;
  ProfilePath path() const { return ProfilePath{cfg_.profile_dirs}; }
  void update_status();
  nlohmann::json conflicts_json(const Profile& p) const;
  // Applies a profile (an operator's switch or the control plane's desired profile).
  SwitchReport switch_to(const Profile& prof);
  // The session to weft-controlplane (cfg_.control_plane): profile.report with the
  // active profile on connect and every heartbeat; the reply (or a profile.apply
  // pushed down the session) names the desired profile, applied when it differs.
  Status cp_start();
  void cp_desired(const std::string& profile);

  SidekickConfig cfg_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<Engine> engine_;
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Server> server_;
  Source verify_timer_;
  Source converge_timer_;
  std::unique_ptr<LinkWatch> link_watch_;
  Source link_debounce_;
  Source sighup_;  // re-reads the control-plane TLS files
  nlohmann::json convergence_ = nlohmann::json::array();
  int weft_gid_ = -1;
  nlohmann::json last_verify_;
  std::string last_outcome_ = "unknown";
  std::unique_ptr<ControlPlaneLink> cp_;
  rpc::Dispatcher cp_methods_;
  // A desired profile that failed to apply is retried after a minute, not every report.
  // machine.reboot (planned maintenance, sidekick.toml allow_reboot): reboot.target
  // started through systemd's bus, asynchronously.
  Result<nlohmann::json> reboot(const std::string& reason);
  sd_bus* bus_ = nullptr;
  sd_bus_slot* reboot_slot_ = nullptr;
  std::string cp_failed_;
  uint64_t cp_failed_at_us_ = 0;
  // Prometheus /metrics (docs/metrics.md).
  void register_metrics();
  metrics::Registry metrics_;
  std::unique_ptr<metrics::HttpServer> metrics_http_;
  std::map<std::string, uint64_t> switches_;
  uint64_t knob_failures_ = 0, drift_ = 0;
};

}  // namespace weft::sidekick
