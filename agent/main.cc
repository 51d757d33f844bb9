// weft-agent: parse args -> load config -> check prerequisites -> create the manager ->
// recover and listen (READY) -> run the event loop.
#include <pwd.h>

#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "agent/agent_conf.h"
#include "agent/manager.h"
#include "common/daemon.h"
#include "common/daemon_cli.h"
#include "common/log.h"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{"weft-agent: the weft node agent (cgroup v2 task runtime)"};
  DaemonCommandLine cli(app, "weft-agent", "/etc/weft/agent.toml");
  std::string socket, state_dir, cgroup_root;
  app.add_option("--socket", socket, "override: API socket path");
  app.add_option("--state-dir", state_dir, "override: state directory");
  app.add_option("--cgroup-root", cgroup_root, "override: cgroup root directory");
  CLI11_PARSE(app, argc, argv);

  auto loaded = cli.load<agent::AgentConfig>(agent::load_agent_config);
  if (!loaded) return 2;
  agent::AgentConfig cfg = std::move(*loaded);
  if (!socket.empty()) cfg.socket = socket;
  if (!state_dir.empty()) cfg.state_dir = state_dir;
  if (!cgroup_root.empty()) cfg.cgroup_root = cgroup_root;

  bool under_systemd = std::getenv("INVOCATION_ID") != nullptr;
  auto resolved = agent::resolve_agent_config(&cfg, under_systemd);
  if (resolved.ok() && cfg.host_root == "/") resolved = agent::check_cgroup2_dir(cfg.cgroup_root);
  if (!resolved.ok()) {
    std::cerr << "weft-agent: " << resolved.error().str() << "\n";
    return 2;
  }
  if (cli.check_only()) {
    // What only this host can tell: the TLS files' contents, the default task user.
    Status host = check_control_plane_tls_files(cfg.control_plane_tls);
    const std::string user = cfg.default_task_user.value_or("");
    bool numeric = !user.empty() && user.find_first_not_of("0123456789") == std::string::npos;
    if (host.ok() && !user.empty() && !numeric && ::getpwnam(user.c_str()) == nullptr)
      host = field_error("default_task_user",
                         "'" + *cfg.default_task_user + "' is not a user on this machine");
    if (!host.ok()) {
      std::cerr << "weft-agent: " << host.error().str() << "\n";
      return 2;
    }
    std::cout << "configuration ok\n"
              << "  socket:      " << cfg.socket << "\n"
              << "  state_dir:   " << cfg.state_dir << "\n"
              << "  cgroup_root: " << cfg.cgroup_root << "\n"
              << "  machine_id:  " << cfg.machine_id << "\n"
              << "  init_path:   " << cfg.init_path << "\n";
    return 0;
  }

  return run_daemon(agent::Manager::create(std::move(cfg), agent::make_real_cgroupfs()));
}
