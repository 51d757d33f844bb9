// weft-hcs: parse args -> load config -> create the manager (restore state, open the
// kernel log, listen, READY) -> run the event loop.
#include <iostream>

#include <CLI/CLI.hpp>

#include "common/daemon.h"
#include "common/log.h"
#include "hcs/manager.h"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{"weft-hcs: machine health checking"};
  std::string config_path = "/etc/weft/hcs.toml";
  bool check_only = false;
  app.add_option("-c,--config", config_path, "configuration file");
  app.add_flag("--check-config", check_only, "validate the configuration and exit");
  CLI11_PARSE(app, argc, argv);
  log_set_ident("weft-hcs");
  auto loaded = load_config_or_defaults<hcs::HcsConfig>(
      "weft-hcs", config_path, app.count("--config") > 0, hcs::load_hcs_config);
  if (!loaded) return 2;
  hcs::HcsConfig cfg = std::move(*loaded);
  log_set_level_name(cfg.log_level);
  if (check_only) {
    if (auto s = check_control_plane_tls_files(cfg.control_plane_tls); !s.ok()) {
      std::cerr << "weft-hcs: " << s.error().str() << "\n";
      return 2;
    }
    std::cout << "configuration ok\n";
    return 0;
  }
  return run_daemon(hcs::Manager::create(std::move(cfg)));
}
