// weft-hcs: parse args -> load config -> create the manager (restore state, open the
// kernel log, listen, READY) -> run the event loop.
#include <iostream>

#include <CLI/CLI.hpp>

#include "common/daemon.h"
#include "common/daemon_cli.h"
#include "common/log.h"
#include "hcs/manager.h"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{"weft-hcs: machine health checking"};
  DaemonCommandLine cli(app, "weft-hcs", "/etc/weft/hcs.toml");
  CLI11_PARSE(app, argc, argv);
  auto loaded = cli.load<hcs::HcsConfig>(hcs::load_hcs_config);
  if (!loaded) return 2;
  hcs::HcsConfig cfg = std::move(*loaded);
  if (cli.check_only()) {
    if (auto s = check_control_plane_tls_files(cfg.control_plane_tls); !s.ok()) {
      std::cerr << "weft-hcs: " << s.error().str() << "\n";
      return 2;
    }
    std::cout << "configuration ok\n";
    return 0;
  }
  return run_daemon(hcs::Manager::create(std::move(cfg)));
}
