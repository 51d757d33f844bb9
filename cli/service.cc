// weftctl service: service discovery, each job's ready tasks, their addresses and ports
// (ls, show, watch; docs/services.md).
#include "cli/cluster.h"

#include <chrono>

namespace weft::cli {

namespace {

struct ServiceOptions {
  std::string job;
  int watch_s = 0;  // watch: stop after this many seconds (0: until interrupted)
};

// One job's endpoints as rows: TASK INDEX MACHINE ADDRESS PORTS.
void endpoint_rows(const json& service, std::vector<std::vector<std::string>>* rows) {
  if (!service.is_object() || !service.contains("endpoints")) return;
  for (const auto& e : service["endpoints"]) {
    std::string ports;
    if (e.contains("ports"))
      for (const auto& [name, p] : e["ports"].items())
        ports += (ports.empty() ? "" : ",") + name + "=" + p.dump();
    rows->push_back({str_or(e, "task"), e.value("index", json(0)).dump(), str_or(e, "machine"),
                     str_or(e, "address"), ports.empty() ? "-" : ports});
  }
}

int service_ls(const Globals& g) {
  json r = call_or_die(*cp_client(g), "service.ls", json::object());
  print_json_or(g, r, [&] {
    std::vector<std::vector<std::string>> rows = {{"JOB", "ENTITLEMENT", "ENDPOINTS", "DNS"}};
    for (const auto& s : r["services"])
      rows.push_back(
          {str_or(s, "job"), str_or(s, "entitlement"), s["endpoints"].dump(), str_or(s, "dns")});
    print_table(rows);
    // An agent is behind when it has not acknowledged all it was sent (a control plane
    // before interest says only its version: behind the table's).
    size_t behind = 0, all = 0;
    for (const auto& a : r["agents"]) {
      if (!a.is_object()) continue;
      behind += a.contains("behind") ? a["behind"] == true : a["version"] != r["version"];
      all += a.value("jobs", json("all")) == "all";
    }
    std::cout << r["agents"].size() << " agent(s) answer DNS (" << all
              << " for every job, the others for the jobs their clients asked for); " << behind
              << " behind what they were sent; " << r["stops_waiting"]
              << " stop(s) waiting for them\n";
  });
  return 0;
}

int service_show(const Globals& g, const std::string& job) {
  json r = call_or_die(*cp_client(g), "service.show", {{"job", job}});
  print_json_or(g, r, [&] {
    if (r.contains("dns")) std::cout << "dns: " << str_or(r, "dns") << "\n";
    std::vector<std::vector<std::string>> rows = {{"TASK", "INDEX", "MACHINE", "ADDRESS", "PORTS"}};
    endpoint_rows(r, &rows);
    print_table(rows);
  });
  return 0;
}

int service_watch(const Globals& g, const ServiceOptions& o) {
  auto cp = cp_client(g);
  // watch: Consul-style blocking queries, each answered when something changed.
  uint64_t index = 0;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    json params{{"index", index}, {"wait_ms", 30000}};
    if (!o.job.empty()) params["job"] = o.job;
    if (o.watch_s > 0) {
      auto left = std::chrono::seconds(o.watch_s) - (std::chrono::steady_clock::now() - start);
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
      if (ms <= 0) return 0;
      params["wait_ms"] = std::min<int64_t>(ms, 30000);
    }
    json r = call_or_die(*cp, "service.watch", params, 65000);
    uint64_t now = r.value("index", uint64_t{0});
    if (now != index || index == 0) {
      print_json_or(g, r, [&] {
        std::vector<std::vector<std::string>> rows = {
            {"TASK", "INDEX", "MACHINE", "ADDRESS", "PORTS"}};
        if (r.contains("service")) {
          std::cout << "== " << o.job << " (index " << now << ")\n";
          endpoint_rows(r["service"], &rows);
        } else {
          std::cout << "== every job (index " << now << ")\n";
          for (const auto& [job, s] : r["services"].items()) endpoint_rows(s, &rows);
        }
        print_table(rows);
      });
      std::cout.flush();
    }
    index = std::max(index, now);
  }
}

}  // namespace

void add_service_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<ServiceOptions>();
  CLI::App* svc = app.add_subcommand("service",
                                     "service discovery: each job's ready tasks, their addresses "
                                     "and ports (docs/services.md)");
  svc->require_subcommand(1);
  h.on(svc->add_subcommand("ls", "every job with endpoints, and each agent's copy"), service_ls);
  CLI::App* sh = svc->add_subcommand("show", "one job's endpoints: task, address, ports");
  sh->add_option("job", o->job, "job name")->required();
  h.on(sh, [o](const Globals& g) { return service_show(g, o->job); });
  CLI::App* w = svc->add_subcommand(
      "watch", "print a job's endpoints (or every job's), then again at each change");
  w->add_option("job", o->job, "job name (default: every job)");
  w->add_option("--for", o->watch_s, "stop after this many seconds");
  h.on(w, [o](const Globals& g) { return service_watch(g, *o); });
}

}  // namespace weft::cli
