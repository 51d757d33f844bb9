// weftctl: the operator CLI. Every command talks to a daemon over the line protocol
// and takes --json to print the daemon's reply as JSON instead of a table.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/cluster.h"
#include "cli/health.h"
#include "cli/profile.h"
#include "cli/task.h"
#include "cli/util.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/rpc.h"

using json = nlohmann::json;
using namespace weft;
using namespace weft::cli;

int main(int argc, char** argv) {
  CLI::App app{"weftctl: control weft daemons"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags such as --json work after the subcommand too
  Globals g;
  if (const char* e = std::getenv("WEFT_AGENT")) g.agent = e;
  if (const char* e = std::getenv("WEFT_SIDEKICK")) g.sidekick = e;
  app.add_option("--agent", g.agent,
                 "weft-agent socket (default /run/weft/agent.sock, $WEFT_AGENT)");
  app.add_option("--sidekick", g.sidekick,
                 "weft-sidekick socket (default /run/weft/sidekick.sock, $WEFT_SIDEKICK)");
  if (const char* e = std::getenv("WEFT_HCS")) g.hcs = e;
  app.add_option("--hcs", g.hcs, "weft-hcs socket (default /run/weft/hcs.sock, $WEFT_HCS)");
  if (auto s = load_cli_config(g); !s.ok()) die(s.error().str(), 2);
  app.add_option("--controlplane", g.controlplane,
                 "weft-controlplane: its socket (default /run/weft/controlplane.sock) or "
                 "tls://host:port ($WEFT_CONTROLPLANE, weftctl.toml)");
  app.add_option("--tls-cert", g.tls_cert, "your certificate for tls:// ($WEFT_TLS_CERT)");
  app.add_option("--tls-key", g.tls_key, "its private key ($WEFT_TLS_KEY)");
  app.add_option("--tls-ca", g.tls_ca,
                 "CA bundle the control plane's certificate is checked "
                 "against ($WEFT_TLS_CA)");
  app.add_option("--tls-server-name", g.tls_server_name,
                 "name the control plane's certificate must carry (default: the host given)");
  app.add_flag("--json", g.json_out, "print replies as JSON");
  ClusterCommands cluster;
  add_cluster_commands(app, cluster);

  TaskCommands tasks;
  add_task_commands(app, tasks);
  HealthCommands health;
  add_health_commands(app, health);
  ProfileCommands profile;
  add_profile_commands(app, profile);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (int rc : {run_cluster_commands(cluster, g), run_health_commands(health, g),
                 run_profile_commands(profile, g), run_task_commands(tasks, g)})
    if (rc >= 0) return rc;
  return 0;
}
