// weft-sidekick: parse args -> load config -> create the manager (recover, re-apply,
// listen, READY) -> run the event loop.
#include <iostream>

#include <CLI/CLI.hpp>

#include "common/daemon.h"
#include "common/daemon_cli.h"
#include "common/log.h"
#include "sidekick/manager.h"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{
      "weft-sidekick: applies host profiles, switched by diff, verified, with a durable baseline"};
  DaemonCommandLine cli(app, "weft-sidekick", "/etc/weft/sidekick.toml");
  std::string socket, state_dir;
  app.add_option("--socket", socket, "override: API socket path");
  app.add_option("--state-dir", state_dir, "override: state directory");
  CLI11_PARSE(app, argc, argv);

  auto loaded = cli.load<sidekick::SidekickConfig>(sidekick::load_sidekick_config);
  if (!loaded) return 2;
  sidekick::SidekickConfig cfg = std::move(*loaded);
  if (!socket.empty()) cfg.socket = socket;
  if (!state_dir.empty()) cfg.state_dir = state_dir;
  if (auto s = sidekick::resolve_sidekick_config(&cfg); !s.ok()) {
    std::cerr << "weft-sidekick: " << s.error().str() << "\n";
    return 2;
  }
  if (auto s = check_control_plane_tls_files(cfg.control_plane_tls); cli.check_only() && !s.ok()) {
    std::cerr << "weft-sidekick: " << s.error().str() << "\n";
    return 2;
  }
  if (cli.check_only()) {
    std::cout << "configuration ok\n  socket: " << cfg.socket << "\n  state_dir: " << cfg.state_dir
              << "\n  workload_cgroup: " << cfg.workload_cgroup << "\n";
    return 0;
  }
  return run_daemon(sidekick::Manager::create(std::move(cfg)));
}
