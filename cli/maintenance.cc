// weftctl maintenance: planned maintenance, machines drained with notice, stopped at the
// start, back in service after (schedule, ls, cancel; docs/maintenance.md).
#include "cli/cluster.h"

namespace weft::cli {

namespace {

struct MaintenanceOptions {
  std::string machine, domain, dc, start, duration, notice, reason;
  bool reboot = false, all = false;
  uint64_t id = 0;
};

int maintenance_schedule(const Globals& g, const MaintenanceOptions& o) {
  json p{{"start", o.start}, {"duration", o.duration}, {"reboot", o.reboot}};
  int targets = 0;
  for (auto [key, v] : {std::pair{"machine", &o.machine}, {"domain", &o.domain}, {"dc", &o.dc}})
    if (!v->empty()) {
      p[key] = *v;
      ++targets;
    }
  if (targets != 1) die("give exactly one of --machine, --domain or --dc", 2);
  if (!o.notice.empty()) p["notice"] = o.notice;
  if (!o.reason.empty()) p["reason"] = o.reason;
  json r = call_or_die(*cp_client(g), "maintenance.schedule", p);
  print_json_or(g, r, [&] {
    std::cout << "maintenance " << r.value("id", uint64_t{0})
              << " scheduled: " << str_or(r, "target_kind") << " " << str_or(r, "target")
              << " from " << str_or(r, "start") << " to " << str_or(r, "end") << "\n";
  });
  return 0;
}

int maintenance_ls(const Globals& g, const MaintenanceOptions& o) {
  json r = call_or_die(*cp_client(g), "maintenance.ls", {{"all", o.all}});
  print_json_or(g, r, [&] {
    std::vector<std::vector<std::string>> rows = {
        {"ID", "TARGET", "START", "END", "STATE", "MACHINES", "REBOOT", "REASON", "WAITING"}};
    for (const auto& e : r["events"])
      rows.push_back({std::to_string(e.value("id", uint64_t{0})),
                      str_or(e, "target_kind") + " " + str_or(e, "target"), str_or(e, "start"),
                      str_or(e, "end"), str_or(e, "state"),
                      std::to_string(e.value("machines", json::array()).size()),
                      e.value("reboot", false) ? "yes" : "no", str_or(e, "reason"),
                      str_or(e, "message")});
    print_table(rows);
  });
  return 0;
}

}  // namespace

void add_maintenance_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<MaintenanceOptions>();
  CLI::App* maint = app.add_subcommand("maintenance",
                                       "planned maintenance: machines drained with notice, "
                                       "stopped at the start, back in service after "
                                       "(docs/maintenance.md)");
  maint->require_subcommand(1);
  CLI::App* sched = maint->add_subcommand("schedule", "announce a maintenance window (admin)");
  sched->add_option("--machine", o->machine, "one machine");
  sched->add_option("--domain", o->domain, "every machine of a rack or MSB");
  sched->add_option("--dc", o->dc, "every machine of a datacenter");
  sched
      ->add_option("--start", o->start,
                   "when the machines go down: 2026-11-23T14:00:00Z (UTC), or +30m from now")
      ->required();
  sched->add_option("--duration", o->duration, "how long (e.g. 30m, 2h)")->required();
  sched->add_option("--notice", o->notice,
                    "drain and tell TaskControllers this long before (default 15m)");
  sched->add_option("--reason", o->reason, "what is done (kernel upgrade, ...)");
  sched->add_flag("--reboot", o->reboot,
                  "reboot each machine once it runs nothing (sidekick allow_reboot)");
  h.on(sched, [o](const Globals& g) { return maintenance_schedule(g, *o); });
  CLI::App* list = maint->add_subcommand("ls", "maintenance events not yet ended");
  list->add_flag("--all", o->all, "ended ones too");
  h.on(list, [o](const Globals& g) { return maintenance_ls(g, *o); });
  CLI::App* cancel =
      maint->add_subcommand("cancel", "end an event now: its machines return (admin)");
  cancel->add_option("id", o->id, "event id")->required();
  h.on(cancel, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "maintenance.cancel", {{"id", o->id}});
    print_json_or(g, r, [&] { std::cout << "maintenance " << o->id << " cancelled\n"; });
    return 0;
  });
}

}  // namespace weft::cli
