#include "cli/region.h"

#include <iostream>

namespace weft::cli {

void add_region_commands(CLI::App& app, ClusterCommands& cluster, RegionCommands& c) {
  c.e_move = cluster.ent->add_subcommand(
      "move",
      "move an entitlement, its jobs and machines to another shard of the region without "
      "restarting a task (admin, through a front end; docs/regions.md)");
  c.e_move->add_option("name", c.name, "entitlement name")->required();
  c.e_move->add_option("--to", c.to, "the shard it goes to")->required();
  c.e_move->add_flag("--detach", c.detach,
                     "return once the move is under way (weftctl entitlement show follows it)");
  c.e_move->add_option("--timeout", c.timeout_s, "give up waiting after this many seconds")
      ->check(CLI::PositiveNumber);
  c.shard = app.add_subcommand("shard", "a region's shards (docs/regions.md)");
  c.shard->require_subcommand(1);
  c.s_drain = c.shard->add_subcommand(
      "drain",
      "move every entitlement of a shard to the others, one at a time, and give it no new "
      "one; then it may be removed (admin, through a front end)");
  c.s_drain->add_option("shard", c.name, "shard id")->required();
  c.s_drain->add_flag("--detach", c.detach, "return once the moves are under way");
  c.s_drain->add_option("--timeout", c.timeout_s, "give up waiting after this many seconds")
      ->check(CLI::PositiveNumber);
}

int run_region_commands(const RegionCommands& c, const Globals& g) {
  if (c.e_move && c.e_move->parsed()) {
    auto cp = std::make_unique<CpClient>(g);
    json r = call_or_die(*cp, "entitlement.move",
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
  if (c.s_drain && c.s_drain->parsed()) {
    auto cp = std::make_unique<CpClient>(g);
    json r = call_or_die(*cp, "shard.drain", {{"shard", c.name}, {"wait", !c.detach}},
                         c.timeout_s * 1000);
    print_json_or(g, r, [&] {
      if (c.detach) {
        std::cout << "shard " << c.name << " draining: " << r.value("moving", json::array()).dump()
                  << "\n";
        return;
      }
      for (const auto& m : r.value("moved", json::array()))
        std::cout << "moved " << str_or(m, "entitlement") << " to shard " << str_or(m, "to")
                  << "\n";
      for (const auto& m : r.value("failed", json::array()))
        std::cout << "NOT moved " << str_or(m, "entitlement") << ": " << str_or(m, "error") << "\n";
      std::cout << "shard " << c.name
                << (r.value("empty", false) ? " holds no entitlement now: it may be removed\n"
                                            : " still holds entitlements\n");
    });
    return r.value("empty", false) ? 0 : 1;
  }
  return -1;
}

}  // namespace weft::cli
