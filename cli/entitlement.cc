// weftctl entitlement: machine quotas with a host profile (create, owners, grant, update,
// rm, ls, show; `move` is a region's, cli/region.cc).
#include "cli/cluster.h"

namespace weft::cli {

namespace {

struct EntitlementOptions {
  std::string name, profile, dc;
  int64_t quota = 0, max_unavailable = 1;
  std::vector<std::string> owners;
  // grant: what its jobs' tasks may ask of the host (docs/security.md).
  bool privileged = false, seccomp = false, host_network = false, low_ports = false;
  std::vector<std::string> users, groups, namespaces, paths;
  FollowOptions follow;
};

// entitlement update --profile: the roll's progress until every machine applied it.
int follow_profile_roll(CpClient& c, const std::string& name, int timeout_s, bool json_out) {
  auto poll = [&]() -> Progress {
    json r = call_or_die(c, "entitlement.show", {{"name", name}});
    json roll = r.value("profile_roll", json{{"done", true}});
    Progress p;
    p.j = {{"entitlement", name}, {"profile", r["profile"]}, {"profile_roll", roll}};
    if (roll.value("done", false)) {
      p.line = "profile " + str_or(r, "profile", "any") + " applied on every machine of " + name;
      p.verdict = Progress::Verdict::kDone;
      return p;
    }
    std::string applying;
    for (const auto& m : roll["applying"]) applying += " " + m.get<std::string>();
    p.line = "profile " + str_or(r, "profile", "any") + ": " +
             std::to_string(roll["waiting"].size()) +
             " machines waiting, applying:" + (applying.empty() ? " none" : applying);
    return p;
  };
  return follow(poll, timeout_s, json_out, "weftctl entitlement show " + name);
}

int entitlement_create(const Globals& g, const EntitlementOptions& o) {
  json p{{"name", o.name}, {"quota", o.quota}};
  if (o.quota < 1) die("--quota must be at least 1", 2);
  if (!o.profile.empty()) p["profile"] = o.profile;
  if (!o.dc.empty()) p["dc"] = o.dc;
  if (!o.owners.empty()) p["owners"] = o.owners;
  json r = call_or_die(*cp_client(g), "entitlement.create", p);
  print_json_or(g, r, [&] { std::cout << "entitlement " << o.name << " created\n"; });
  return 0;
}

int set_owners(const Globals& g, const EntitlementOptions& o) {
  json r =
      call_or_die(*cp_client(g), "entitlement.update", {{"name", o.name}, {"owners", o.owners}});
  print_json_or(g, r, [&] {
    std::string list;
    for (const auto& owner : o.owners) list += " " + owner;
    std::cout << "entitlement " << o.name << " owners:" << (list.empty() ? " (admins only)" : list)
              << "\n";
  });
  return 0;
}

int entitlement_grant(const Globals& g, const EntitlementOptions& o) {
  json grants = json::object();
  if (o.privileged) grants["privileged"] = true;
  if (o.seccomp) grants["seccomp_unconfined"] = true;
  if (o.host_network) grants["host_network"] = true;
  if (o.low_ports) grants["low_ports"] = true;
  for (auto [key, v] : {std::pair{"users", &o.users},
                        {"groups", &o.groups},
                        {"host_namespaces", &o.namespaces},
                        {"host_paths", &o.paths}})
    if (!v->empty()) grants[key] = *v;
  json r = call_or_die(*cp_client(g), "entitlement.update", {{"name", o.name}, {"grants", grants}});
  print_json_or(g, r, [&] {
    std::cout << "entitlement " << o.name
              << " grants: " << (r["grants"].empty() ? "none (restricted)" : r["grants"].dump())
              << "\n";
  });
  return 0;
}

int entitlement_update(const Globals& g, const EntitlementOptions& o, const CLI::App& cmd) {
  json p{{"name", o.name}};
  if (cmd.count("--quota")) p["quota"] = o.quota;
  if (cmd.count("--profile")) p["profile"] = o.profile;
  if (cmd.count("--max-unavailable")) p["max_unavailable"] = o.max_unavailable;
  if (p.size() == 1) die("entitlement update needs --quota or --profile", 2);
  auto cp = cp_client(g);
  json r = call_or_die(*cp, "entitlement.update", p);
  if (o.follow.detach || !r.contains("profile_roll")) {
    print_json_or(g, r, [&] {
      std::cout << "entitlement " << o.name << ": quota " << str_or(r, "quota") << ", profile "
                << str_or(r, "profile", "any") << ", " << str_or(r, "machines") << " machines\n";
    });
    return 0;
  }
  return follow_profile_roll(*cp, o.name, o.follow.timeout_s, g.json_out);
}

int entitlement_ls(const Globals& g) {
  json r = call_or_die(*cp_client(g), "entitlement.ls", json::object());
  print_json_or(g, r, [&] {
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "QUOTA", "MACHINES", "PROFILE", "DC", "OWNERS"}};
    for (const auto& e : r["entitlements"]) {
      std::string owners;
      for (const auto& o : e.value("owners", json::array()))
        if (o.is_string()) owners += (owners.empty() ? "" : ",") + o.get<std::string>();
      rows.push_back({str_or(e, "name"), str_or(e, "quota"), str_or(e, "machines"),
                      str_or(e, "profile"), str_or(e, "dc"), owners.empty() ? "-" : owners});
    }
    print_table(rows);
  });
  return 0;
}

int entitlement_show(const Globals& g, const std::string& name) {
  json r = call_or_die(*cp_client(g), "entitlement.show", {{"name", name}});
  print_json_or(g, r, [&] {
    json head = r;
    head.erase("machines");
    print_kv(head);
    std::cout << "\n";
    machine_table(r["machines"]);
  });
  return 0;
}

}  // namespace

CLI::App* add_entitlement_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<EntitlementOptions>();
  CLI::App* ent =
      app.add_subcommand("entitlement", "entitlements: machine quotas with a host profile");
  ent->require_subcommand(1);

  CLI::App* c = ent->add_subcommand("create", "create an entitlement");
  c->add_option("name", o->name, "entitlement name")->required();
  c->add_option("--quota", o->quota, "most machines it may hold")->required();
  c->add_option("--profile", o->profile, "host profile its machines run (default: any)");
  c->add_option("--dc", o->dc, "only machines of this datacenter");
  c->add_option("--owner", o->owners,
                "who may run jobs in it besides admins: CN=, OU=, O= or DNS= of their "
                "certificate (repeatable)");
  h.on(c, [o](const Globals& g) { return entitlement_create(g, *o); });

  CLI::App* owners =
      ent->add_subcommand("owners", "set who may run jobs in an entitlement (admin)");
  owners->add_option("name", o->name, "entitlement name")->required();
  owners->add_option("--owner", o->owners, "CN=, OU=, O= or DNS= (repeatable; none: admins only)");
  h.on(owners, [o](const Globals& g) { return set_owners(g, *o); });

  CLI::App* gr = ent->add_subcommand(
      "grant",
      "set what its jobs' tasks may ask of the host (admin; replaces the grants; none: the "
      "restricted default; docs/security.md)");
  gr->add_option("name", o->name, "entitlement name")->required();
  gr->add_option("--user", o->users, "a user a task may run as (repeatable)");
  gr->add_option("--group", o->groups, "a group a task may run with (repeatable)");
  gr->add_option("--host-namespace", o->namespaces,
                 "pid, ipc, uts or mount: a namespace a task may share with the host "
                 "(repeatable)");
  gr->add_option("--host-path", o->paths,
                 "a host directory a task may bind in or use as its root (repeatable)");
  gr->add_flag("--seccomp-unconfined", o->seccomp, "tasks may turn seccomp off");
  gr->add_flag("--host-network", o->host_network,
               "tasks may use the host's network (namespaces.network = \"host\"): "
               "every port of the machine and what it serves on loopback");
  gr->add_flag("--low-ports", o->low_ports,
               "a job may publish fixed ports below 1024 on its machines");
  gr->add_flag("--privileged", o->privileged,
               "every host privilege but root and the sockets' group");
  h.on(gr, [o](const Globals& g) { return entitlement_grant(g, *o); });

  CLI::App* up = ent->add_subcommand(
      "update",
      "change an entitlement's quota or host profile (admin; a profile rolls over its "
      "machines)");
  up->add_option("name", o->name, "entitlement name")->required();
  up->add_option("--quota", o->quota, "most machines it may hold")->check(CLI::PositiveNumber);
  up->add_option("--profile", o->profile, "host profile its machines run (\"\": any)");
  up->add_option("--max-unavailable", o->max_unavailable,
                 "machines applying the new profile at once (default 1)")
      ->check(CLI::PositiveNumber);
  add_follow_options(up, o->follow);
  h.on(up, [o, up](const Globals& g) { return entitlement_update(g, *o, *up); });

  CLI::App* rm = ent->add_subcommand("rm", "remove an entitlement without jobs (admin)");
  rm->add_option("name", o->name, "entitlement name")->required();
  h.on(rm, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "entitlement.rm", {{"name", o->name}});
    print_json_or(g, r, [&] { std::cout << "entitlement " << o->name << " removed\n"; });
    return 0;
  });

  h.on(ent->add_subcommand("ls", "list entitlements"), entitlement_ls);
  CLI::App* sh = ent->add_subcommand("show", "one entitlement with its machines and jobs");
  sh->add_option("name", o->name, "entitlement name")->required();
  h.on(sh, [o](const Globals& g) { return entitlement_show(g, o->name); });
  return ent;
}

}  // namespace weft::cli
