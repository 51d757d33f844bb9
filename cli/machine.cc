// weftctl machine: the cluster's machines (ls, show, drain, rm, assign, release).
#include "cli/cluster.h"

namespace weft::cli {

namespace {

struct MachineOptions {
  std::string name, entitlement;
  bool undo = false;
  FollowOptions follow;
};

// Follows a drain until the machine runs no task of the cluster's.
int follow_drain(CpClient& c, const std::string& machine, int timeout_s, bool json_out) {
  auto poll = [&]() -> Progress {
    json r = call_or_die(c, "machine.show", {{"machine", machine}});
    int left = 0;
    for (const auto& t : r["task_list"]) {
      TaskState st = state_of(t);
      left += st == TaskState::kRunning || st == TaskState::kStarting ||
              st == TaskState::kStopping || st == TaskState::kPending || st == TaskState::kDraining;
    }
    Progress p;
    p.line = "drain " + machine + ": " + std::to_string(left) + " task" + (left == 1 ? "" : "s") +
             " left, state " + str_or(r, "state");
    p.j = {{"machine", machine}, {"tasks_left", left}, {"state", r["state"]}};
    if (left == 0) p.verdict = Progress::Verdict::kDone;
    return p;
  };
  return follow(poll, timeout_s, json_out, "weftctl machine show " + machine);
}

// Page by page (machine.ls answers at most 1000 machines at a time; through a region's
// front end, `next` is each shard's cursor). What the front end could not reach is kept
// and said, never dropped.
int machine_ls(const Globals& g) {
  auto cp = cp_client(g);
  json all = json::array(), away = json::array();
  json params = json::object();
  bool truncated = false;
  for (;;) {
    json r = call_or_die(*cp, "machine.ls", params);
    for (auto& m : r["machines"]) all.push_back(std::move(m));
    if (r.contains("unreachable") && r["unreachable"].is_array())
      for (auto& u : r["unreachable"]) away.push_back(std::move(u));
    truncated |= r.value("truncated", false);
    if (!r.contains("next") || !(r["next"].is_string() || r["next"].is_object())) break;
    params["after"] = r["next"];
  }
  json r{{"machines", all}};
  if (!away.empty()) r["unreachable"] = away;
  if (truncated) r["truncated"] = true;
  print_json_or(g, r, [&] {
    machine_table(r["machines"]);
    warn_partial(r, "machines");
  });
  return 0;
}

int machine_show(const Globals& g, const std::string& name) {
  json r = call_or_die(*cp_client(g), "machine.show", {{"machine", name}});
  print_json_or(g, r, [&] {
    json head = r;
    for (const char* k : {"task_list", "events", "problems"}) head.erase(k);
    print_kv(head);
    if (!r["problems"].empty()) {
      std::cout << "problems:\n";
      for (const auto& p : r["problems"])
        std::cout << "  " << str_or(p, "probe") << ": " << str_or(p, "state") << " — "
                  << str_or(p, "detail") << "\n";
    }
    if (!r["events"].empty()) {
      std::cout << "events:\n";
      for (const auto& e : r["events"])
        std::cout << "  " << str_or(e, "kind") << ": " << str_or(e, "detail") << "\n";
    }
    if (!r["task_list"].empty()) {
      std::cout << "\n";
      task_table(r["task_list"]);
    }
  });
  return 0;
}

}  // namespace

CLI::App* add_machine_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<MachineOptions>();
  CLI::App* machine = app.add_subcommand("machine", "the cluster's machines (weft-controlplane)");
  machine->require_subcommand(1);

  h.on(machine->add_subcommand("ls", "every machine with its state and entitlement"), machine_ls);

  CLI::App* show = machine->add_subcommand("show", "one machine: health, profile, tasks, events");
  show->add_option("machine", o->name, "machine id")->required();
  h.on(show, [o](const Globals& g) { return machine_show(g, o->name); });

  CLI::App* drain = machine->add_subcommand(
      "drain", "move a machine's tasks elsewhere and take no new ones (maintenance)");
  drain->add_option("machine", o->name, "machine id")->required();
  drain->add_flag("--undo", o->undo, "put the machine back in service");
  add_follow_options(drain, o->follow);
  h.on(drain, [o](const Globals& g) {
    auto cp = cp_client(g);
    json r = call_or_die(*cp, "machine.drain", {{"machine", o->name}, {"drained", !o->undo}});
    if (o->undo || o->follow.detach) {
      print_json_or(
          g, r, [&] { std::cout << o->name << (o->undo ? " back in service\n" : " draining\n"); });
      return 0;
    }
    return follow_drain(*cp, o->name, o->follow.timeout_s, g.json_out);
  });

  CLI::App* rm = machine->add_subcommand(
      "rm", "forget a machine that is gone (dead, its tasks moved); it returns if it registers");
  rm->add_option("machine", o->name, "machine id")->required();
  h.on(rm, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "machine.rm", {{"machine", o->name}});
    print_json_or(g, r, [&] { std::cout << o->name << " removed\n"; });
    return 0;
  });

  CLI::App* assign = machine->add_subcommand(
      "assign", "give an entitlement this machine (admin; it stays until released)");
  assign->add_option("machine", o->name, "machine id")->required();
  assign->add_option("entitlement", o->entitlement, "entitlement name")->required();
  h.on(assign, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "machine.assign",
                         {{"machine", o->name}, {"entitlement", o->entitlement}});
    print_json_or(g, r, [&] {
      std::cout << o->name << " assigned to " << o->entitlement << " (profile "
                << str_or(r, "profile", "any") << ")\n";
    });
    return 0;
  });

  CLI::App* release = machine->add_subcommand(
      "release", "take an assigned machine back to the free pool once its tasks are gone (admin)");
  release->add_option("machine", o->name, "machine id")->required();
  h.on(release, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "machine.release", {{"machine", o->name}});
    print_json_or(g, r, [&] {
      if (r.value("free", false))
        std::cout << o->name << " is in the free pool\n";
      else
        std::cout << o->name << " returns to the free pool when its " << str_or(r, "tasks")
                  << " tasks are gone\n";
    });
    return 0;
  });
  return machine;
}

}  // namespace weft::cli
