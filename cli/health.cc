#include "cli/health.h"

#include <algorithm>

namespace weft::cli {

void add_health_commands(CLI::App& app, HealthCommands& c) {
  c.health = app.add_subcommand("health", "machine health (weft-hcs): verdict and failing probes");
  c.probes = c.health->add_subcommand("probes", "every probe with its state and figures");
  c.probes->add_option("names", c.names, "only these probes (e.g. oom link:eth0)");
  c.history = c.health->add_subcommand("history", "probe state changes");
  c.history->add_option("-n,--limit", c.limit, "how many");
}

int run_health_commands(const HealthCommands& c, const Globals& g) {
  if (!c.health->parsed()) return -1;
  auto hc = connect_or_die(g.hcs, "weft-hcs", "--hcs");
  if (c.probes->parsed()) {
    json r = call_or_die(*hc, "health.probes", json::object());
    if (!c.names.empty()) {
      json keep = json::array();
      for (const auto& p : r["probes"])
        if (std::find(c.names.begin(), c.names.end(), str_or(p, "probe")) != c.names.end())
          keep.push_back(p);
      if (keep.size() != c.names.size()) {
        std::cerr << "weftctl: no such probe; `weftctl health probes` lists them\n";
        return 1;
      }
      r["probes"] = keep;
    }
    if (g.json_out)
      std::cout << r.dump(2) << "\n";
    else {
      std::vector<std::vector<std::string>> rows = {
          {"PROBE", "STATE", "SINCE", "SOURCE", "DETAIL"}};
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
  if (c.history->parsed()) {
    json r = call_or_die(*hc, "health.history", {{"limit", c.limit}});
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
  json r = call_or_die(*hc, "health.verdict", json::object());
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

}  // namespace weft::cli
