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
#include "cli/completion.h"
#include "cli/health.h"
#include "cli/profile.h"
#include "cli/task.h"
#include "cli/tls_helper.h"
#include "cli/util.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/rpc/protocol.h"

using json = nlohmann::json;
using namespace weft;
using namespace weft::cli;

namespace {

// The first word of the command line that is not a global option or its value: the
// command ("task" in `weftctl --agent S task run ...`), or "" when help is asked for
// before it or an option weftctl does not know comes first.
std::string command_word(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") return "";
    if (a.empty() || a[0] != '-') return std::string(a);
    if (a == "-h" || a == "--help") return "";
    size_t eq = a.find('=');
    const CLI::Option* opt = app.get_option_no_throw(std::string(a.substr(0, eq)));
    if (!opt) return "";
    if (eq == std::string_view::npos && opt->get_items_expected_max() > 0) ++i;  // its value
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  remember_command_line(argc, argv);
  if (auto s = check_tls_helper_build(); !s.ok()) die(s.error().str(), 2);
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
  // Only the command group named on the command line is built: CLI11 allocates every
  // option of every subcommand it is given, and built whole that heap was ~25 more page
  // faults at every start (docs/decisions.md). Help asked for before any group, or a
  // word weftctl does not know, builds them all so CLI11 lists or rejects as usual.
  enum Group { kCluster, kTasks, kHealth, kProfile, kGroups };
  static constexpr std::pair<const char*, Group> kGroupOf[] = {
      {"machine", kCluster},     {"entitlement", kCluster}, {"job", kCluster},
      {"maintenance", kCluster}, {"audit", kCluster},       {"controlplane", kCluster},
      {"service", kCluster},     {"web", kCluster},         {"shard", kCluster},
      {"rebalance", kCluster},   {"top", kCluster},         {"task", kTasks},
      {"agent", kTasks},         {"image", kTasks},         {"health", kHealth},
      {"profile", kProfile}};
  bool want[kGroups] = {true, true, true, true};
  const std::string word = command_word(app, argc, argv);
  // Completion is generated from the whole table: every group is built for it.
  for (const auto& [name, grp] : kGroupOf)
    if (word == name) {
      std::fill(std::begin(want), std::end(want), false);
      want[grp] = true;
    }
  // Each command file registers its subcommands with the handlers that run them.
  Handlers handlers;
  if (want[kCluster]) add_cluster_commands(app, handlers);
  if (want[kTasks]) {
    CLI::App* task = add_task_commands(app, handlers);
    add_cluster_task_commands(task, handlers);
    add_task_exec_command(task, handlers);
  }
  if (want[kHealth]) add_health_commands(app, handlers);
  if (want[kProfile]) add_profile_commands(app, handlers);
  if (word.empty() || word == "completion" || word == "__names")
    add_completion_commands(app, handlers);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (int rc = handlers.run(g); rc >= 0) return rc;
  return 0;
}
