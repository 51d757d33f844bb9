#include "cli/rebalance.h"

#include <cstdio>
#include <iostream>

namespace weft::cli {

void add_rebalance_commands(CLI::App& app, RebalanceCommands& c) {
  c.group = app.add_subcommand(
      "rebalance", "the ReBalancer: moves that would improve an entitlement's placement");
  c.group->require_subcommand(1);
  c.plan = c.group->add_subcommand(
      "plan",
      "what the ReBalancer would move now (spread, machines freed, CPU balance); "
      "nothing is moved");
  c.plan->add_option("entitlement", c.entitlement, "entitlement name")->required();
  c.plan->add_flag("--exact", c.exact,
                   "the exact planner (GLPK, consolidation only) instead of the local search");
  c.plan->add_option("--budget", c.budget, "moves at most (default 100)")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  c.status = c.group->add_subcommand(
      "status",
      "what the ReBalancer did in an entitlement: budgets, moves under way, the last "
      "plan, the latest moves");
  c.pause = c.group->add_subcommand(
      "pause", "no more moves in the entitlement (moves under way finish; kept across restarts)");
  c.resume = c.group->add_subcommand("resume", "let the ReBalancer move tasks there again");
  for (CLI::App* sub : {c.status, c.pause, c.resume})
    sub->add_option("entitlement", c.entitlement, "entitlement name")->required();
}

namespace {
void score_line(const char* what, const json& s) {
  std::printf("%-7s spread violations %s, machines used %s, empty %s, CPU use sd %.3f\n", what,
              str_or(s, "spread_violations").c_str(), str_or(s, "machines_used").c_str(),
              str_or(s, "machines_empty").c_str(), s.value("cpu_stddev", 0.0));
}
void print_status(const json& r) {
  std::printf("entitlement %s: %s; %s\n", str_or(r, "entitlement").c_str(),
              r.value("paused", false) ? "paused" : "rebalancing", str_or(r, "outcome").c_str());
  std::printf("budget: %s moves a round, %s an hour (%s made in the last hour); every %ss\n",
              str_or(r, "moves_per_round").c_str(), str_or(r, "moves_per_hour").c_str(),
              str_or(r, "moves_last_hour").c_str(), str_or(r, "interval_s").c_str());
  if (r.contains("last_plan")) {
    const json& p = r["last_plan"];
    std::printf("last plan: %s moves\n", str_or(p, "planned").c_str());
    score_line("before:", p.value("before", json::object()));
    score_line("after:", p.value("after", json::object()));
  }
  auto list = [](const char* title, const json& moves) {
    if (moves.empty()) return;
    std::printf("\n%s\n", title);
    for (const auto& m : moves)
      std::printf("  %-40s %s -> %s  (%s)  %s\n", str_or(m, "task").c_str(),
                  str_or(m, "from").c_str(), str_or(m, "to").c_str(), str_or(m, "aim").c_str(),
                  str_or(m, "result").c_str());
  };
  list("moves under way:", r.value("moving", json::array()));
  list("latest moves (newest last):", r.value("recent", json::array()));
}
}  // namespace

int run_rebalance_commands(const RebalanceCommands& c, const Globals& g) {
  if (!c.group || !c.group->parsed()) return -1;
  CpClient cp(g);
  if (c.status->parsed()) {
    json r = call_or_die(cp, "rebalance.status", {{"name", c.entitlement}});
    print_json_or(g, r, [&] { print_status(r); });
    return 0;
  }
  if (c.pause->parsed() || c.resume->parsed()) {
    const bool pause = c.pause->parsed();
    json r = call_or_die(cp, "rebalance.pause", {{"name", c.entitlement}, {"paused", pause}});
    print_json_or(g, r, [&] {
      std::printf("entitlement %s: rebalancing %s\n", c.entitlement.c_str(),
                  pause ? "paused" : "resumed");
    });
    return 0;
  }
  json params{{"name", c.entitlement}, {"planner", c.exact ? "exact" : "local"}};
  if (c.budget > 0) params["budget"] = c.budget;
  json r = call_or_die(cp, "rebalance.plan", params, 60000);
  print_json_or(g, r, [&] {
    std::printf("entitlement %s: %s machines, %s jobs, %s ready tasks; %s planner, %.1f ms%s%s\n",
                c.entitlement.c_str(), str_or(r, "machines").c_str(), str_or(r, "jobs").c_str(),
                str_or(r, "tasks").c_str(), str_or(r, "planner").c_str(),
                r.value("planning_ms", 0.0), r.contains("solver") ? ", " : "",
                r.contains("solver") ? str_or(r, "solver").c_str() : "");
    score_line("now:", r.value("before", json::object()));
    score_line("after:", r.value("after", json::object()));
    const json& moves = r.value("moves", json::array());
    std::printf("\n%zu moves\n", moves.size());
    for (const auto& m : moves)
      std::printf("  %-40s %s -> %s  (%s)\n", str_or(m, "task").c_str(), str_or(m, "from").c_str(),
                  str_or(m, "to").c_str(), str_or(m, "aim").c_str());
  });
  return 0;
}

}  // namespace weft::cli
