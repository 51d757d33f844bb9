// weftctl controlplane: the control plane's replicas (status; docs/replicas.md).
#include "cli/cluster.h"

namespace weft::cli {

void add_controlplane_commands(CLI::App& app, Handlers& h) {
  CLI::App* cp =
      app.add_subcommand("controlplane", "the control plane's replicas (docs/replicas.md)");
  cp->require_subcommand(1);
  CLI::App* status = cp->add_subcommand(
      "status", "each replica given (--controlplane): whether it leads, and which one does");
  h.on(status, [](const Globals& g) {
    json r = controlplane_statuses(g);
    int leaders = 0;
    for (const auto& row : r) leaders += row.value("leading", false);
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {{"ENDPOINT", "STORE", "LEADING", "LEADER"}};
      for (const auto& row : r)
        rows.push_back({str_or(row, "endpoint"), str_or(row, "store"),
                        row.contains("error")         ? "error: " + str_or(row, "error")
                        : row.value("leading", false) ? "yes"
                                                      : "no",
                        str_or(row, "leader")});
      print_table(rows);
    });
    return leaders == 1 ? 0 : 1;  // none (a failover, no etcd) or, never, two
  });
}

}  // namespace weft::cli
