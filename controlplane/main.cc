// weft-controlplane: parse args -> load config -> create the manager (restore state,
// listen, READY) -> run the event loop.
#include <unistd.h>

#include <iostream>

#include <CLI/CLI.hpp>

#include "common/daemon.h"
#include "common/daemon_cli.h"
#include "common/log.h"
#include "controlplane/daemon/manager.h"
#include "controlplane/region/front_end.h"
#include "controlplane/region/region.h"
#include "controlplane/store/etcd_store.h"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{
      "weft-controlplane: the cluster's Resource Broker, allocator and scheduler, or a region's "
      "shard or front end ([region] role)"};
  DaemonCommandLine cli(app, "weft-controlplane", "/etc/weft/controlplane.toml");
  std::string from;
  auto* migrate = app.add_subcommand(
      "migrate",
      "copy a sqlite control-plane state into the etcd store of the configuration ([store]); "
      "every replica must be stopped and the etcd prefix empty");
  migrate->add_option("--from", from, "the sqlite database (default: <state_dir>/controlplane.db)");
  CLI11_PARSE(app, argc, argv);
  auto loaded = cli.load<cp::CpConfig>(cp::load_cp_config);
  if (!loaded) return 2;
  cp::CpConfig cfg = std::move(*loaded);
  if (cli.check_only()) {
    // The files the configuration names, read as the start will read them.
    Status host = cfg.tls.enabled() ? tls::check_config(cfg.tls, "") : Status{};
    if (host.ok() && !cfg.secrets_key.empty()) {
      auto box = SecretBox::load(cfg.secrets_key);
      if (!box.ok()) host = std::move(box).error();
    }
    if (!host.ok()) {
      std::cerr << "weft-controlplane: " << cli.config_path() << ": " << host.error().str() << "\n";
      return 2;
    }
    std::cout << "configuration ok\n";
    return 0;
  }
  if (*migrate)
    return cp::migrate_to_etcd(cfg, from.empty() ? cfg.state_dir + "/controlplane.db" : from);
  // The role ([region] role, docs/regions.md): a front end routes to shards; a shard
  // and the all-in-one are the control plane itself.
  if (cfg.region.role == cp::RegionRole::kFrontEnd)
    return run_daemon(cp::FrontEnd::create(std::move(cfg)));
  return run_daemon(cp::Manager::create(std::move(cfg)));
}
