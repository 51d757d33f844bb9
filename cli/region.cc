// weftctl entitlement move and shard drain: a region's shards (docs/regions.md).
#include "cli/cluster.h"

#include <iostream>

namespace weft::cli {

namespace {

struct RegionOptions {
  std::string name, to;
  bool detach = false;
  int timeout_s = 600;
};

int entitlement_move(const Globals& g, const RegionOptions& c) {
  json r = call_or_die(*cp_client(g), "entitlement.move",
                       {{"name", c.name}, {"to", c.to}, {"wait", !c.detach}}, c.timeout_s * 1000);
  print_json_or(g, r, [&] {
    if (c.detach) {
      std::cout << "entitlement " << c.name << " moving to shard " << c.to
                << " (weftctl entitlement show " << c.name << ")\n";
      return;
    }
    std::cout << "entitlement " << c.name << " moved from shard " << str_or(r, "from")
              << " to shard " << str_or(r, "to") << ": " << str_or(r, "jobs") << " jobs, "
              << str_or(r, "tasks") << " tasks, " << str_or(r, "machines")
              << " machines; its scheduling paused " << str_or(r, "fenced_ms") << " ms\n";
  });
  return 0;
}

int shard_drain(const Globals& g, const RegionOptions& c) {
  json r = call_or_die(*cp_client(g), "shard.drain", {{"shard", c.name}, {"wait", !c.detach}},
                       c.timeout_s * 1000);
  print_json_or(g, r, [&] {
    if (c.detach) {
      std::cout << "shard " << c.name << " draining: " << r.value("moving", json::array()).dump()
                << "\n";
      return;
    }
    for (const auto& m : r.value("moved", json::array()))
      std::cout << "moved " << str_or(m, "entitlement") << " to shard " << str_or(m, "to") << "\n";
    for (const auto& m : r.value("failed", json::array()))
      std::cout << "NOT moved " << str_or(m, "entitlement") << ": " << str_or(m, "error") << "\n";
    std::cout << "shard " << c.name
              << (r.value("empty", false) ? " holds no entitlement now: it may be removed\n"
                                          : " still holds entitlements\n");
  });
  return r.value("empty", false) ? 0 : 1;
}

}  // namespace

void add_region_commands(CLI::App& app, const ClusterNouns& cluster, Handlers& h) {
  auto c = std::make_shared<RegionOptions>();
  CLI::App* move = cluster.entitlement->add_subcommand(
      "move",
      "move an entitlement, its jobs and machines to another shard of the region without "
      "restarting a task (admin, through a front end; docs/regions.md)");
  move->add_option("name", c->name, "entitlement name")->required();
  move->add_option("--to", c->to, "the shard it goes to")->required();
  move->add_flag("--detach", c->detach,
                 "return once the move is under way (weftctl entitlement show follows it)");
  move->add_option("--timeout", c->timeout_s, "give up waiting after this many seconds")
      ->check(CLI::PositiveNumber);
  h.on(move, [c](const Globals& g) { return entitlement_move(g, *c); });

  CLI::App* shard = app.add_subcommand("shard", "a region's shards (docs/regions.md)");
  shard->require_subcommand(1);
  CLI::App* drain = shard->add_subcommand(
      "drain",
      "move every entitlement of a shard to the others, one at a time, and give it no new "
      "one; then it may be removed (admin, through a front end)");
  drain->add_option("shard", c->name, "shard id")->required();
  drain->add_flag("--detach", c->detach, "return once the moves are under way");
  drain->add_option("--timeout", c->timeout_s, "give up waiting after this many seconds")
      ->check(CLI::PositiveNumber);
  h.on(drain, [c](const Globals& g) { return shard_drain(g, *c); });
}

}  // namespace weft::cli
