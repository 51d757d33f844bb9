// weftctl health: the machine's verdict and probes (weft-hcs): health, health probes,
// health history.
#include <algorithm>

#include "cli/health.h"

namespace weft::cli {

namespace {

struct HealthOptions {
  std::vector<std::string> names;
  int limit = 50;
};

std::unique_ptr<rpc::Client> hcs_client(const Globals& g) {
  return connect_or_die(g.hcs, "weft-hcs", "--hcs");
}

int health_probes(const Globals& g, const HealthOptions& o) {
  json r = call_or_die(*hcs_client(g), "health.probes", json::object());
  if (!o.names.empty()) {
    json keep = json::array();
    for (const auto& p : r["probes"])
      if (std::find(o.names.begin(), o.names.end(), str_or(p, "probe")) != o.names.end())
        keep.push_back(p);
    if (keep.size() != o.names.size()) {
      std::cerr << "weftctl: no such probe; `weftctl health probes` lists them\n";
      return 1;
    }
    r["probes"] = keep;
  }
  if (g.json_out)
    std::cout << r.dump(2) << "\n";
  else {
    std::vector<std::vector<std::string>> rows = {{"PROBE", "STATE", "SINCE", "SOURCE", "DETAIL"}};
    for (const auto& p : r["probes"]) {
      std::string source = "-";
      if (p.contains("metrics") && p["metrics"].is_object())
        source = str_or(p["metrics"], "source", "-");
      rows.push_back({str_or(p, "probe"),
                      str_or(p, "state") + (p.value("pinned", false) ? " (flapping)" : ""),
                      str_or(p, "since"), source, str_or(p, "detail")});
    }
    print_table(rows);
  }
  return 0;
}

int health_history(const Globals& g, const HealthOptions& o) {
  json r = call_or_die(*hcs_client(g), "health.history", {{"limit", o.limit}});
  if (g.json_out)
    std::cout << r.dump(2) << "\n";
  else {
    std::vector<std::vector<std::string>> rows = {{"AT", "PROBE", "FROM", "TO", "DETAIL"}};
    for (const auto& t : r["transitions"])
      rows.push_back({str_or(t, "at"), str_or(t, "probe"), str_or(t, "from"), str_or(t, "to"),
                      str_or(t, "detail")});
    print_table(rows);
  }
  return 0;
}

// The verdict: 0 ok, 3 degraded, 1 failed or unknown.
int health_verdict(const Globals& g) {
  json r = call_or_die(*hcs_client(g), "health.verdict", json::object());
  if (g.json_out)
    std::cout << r.dump(2) << "\n";
  else {
    std::cout << "machine: " << str_or(r, "verdict")
              << (r.value("published", false) ? "" : " (first cycle not done)") << "\n";
    for (const auto& p : r["problems"])
      std::cout << "  " << str_or(p, "probe") << ": " << str_or(p, "state") << " since "
                << str_or(p, "since") << " — " << str_or(p, "detail") << "\n";
  }
  std::string v = r.value("verdict", "unknown");
  return v == "ok" ? 0 : v == "degraded" ? 3 : 1;
}

}  // namespace

void add_health_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<HealthOptions>();
  CLI::App* health =
      app.add_subcommand("health", "machine health (weft-hcs): verdict and failing probes");
  h.on(health, health_verdict);
  CLI::App* probes = health->add_subcommand("probes", "every probe with its state and figures");
  probes->add_option("names", o->names, "only these probes (e.g. oom link:eth0)");
  h.on(probes, [o](const Globals& g) { return health_probes(g, *o); });
  CLI::App* history = health->add_subcommand("history", "probe state changes");
  history->add_option("-n,--limit", o->limit, "how many");
  h.on(history, [o](const Globals& g) { return health_history(g, *o); });
}

}  // namespace weft::cli
