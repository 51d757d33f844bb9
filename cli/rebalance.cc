// weftctl rebalance: the ReBalancer, moves that would improve an entitlement's placement
// (plan, status, pause, resume; docs/rebalancer.md).
#include "cli/cluster.h"

#include <cstdio>
#include <iostream>

namespace weft::cli {

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

namespace {

struct RebalanceOptions {
  std::string entitlement;
  bool exact = false;
  int64_t budget = 0;
};

}  // namespace

void add_rebalance_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<RebalanceOptions>();
  CLI::App* group = app.add_subcommand(
      "rebalance", "the ReBalancer: moves that would improve an entitlement's placement");
  group->require_subcommand(1);
  CLI::App* plan = group->add_subcommand(
      "plan",
      "what the ReBalancer would move now (spread, machines freed, CPU balance); "
      "nothing is moved");
  plan->add_option("entitlement", o->entitlement, "entitlement name")->required();
  plan->add_flag("--exact", o->exact,
                 "the exact planner (GLPK, consolidation only) instead of the local search");
  plan->add_option("--budget", o->budget, "moves at most (default 100)")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  CLI::App* status = group->add_subcommand(
      "status",
      "what the ReBalancer did in an entitlement: budgets, moves under way, the last "
      "plan, the latest moves");
  CLI::App* pause = group->add_subcommand(
      "pause", "no more moves in the entitlement (moves under way finish; kept across restarts)");
  CLI::App* resume = group->add_subcommand("resume", "let the ReBalancer move tasks there again");
  for (CLI::App* sub : {status, pause, resume})
    sub->add_option("entitlement", o->entitlement, "entitlement name")->required();

  h.on(plan, [o](const Globals& g) {
    json params{{"name", o->entitlement}, {"planner", o->exact ? "exact" : "local"}};
    if (o->budget > 0) params["budget"] = o->budget;
    json r = call_or_die(*cp_client(g), "rebalance.plan", params, 60000);
    print_json_or(g, r, [&] {
      std::printf("entitlement %s: %s machines, %s jobs, %s ready tasks; %s planner, %.1f ms%s%s\n",
                  o->entitlement.c_str(), str_or(r, "machines").c_str(), str_or(r, "jobs").c_str(),
                  str_or(r, "tasks").c_str(), str_or(r, "planner").c_str(),
                  r.value("planning_ms", 0.0), r.contains("solver") ? ", " : "",
                  r.contains("solver") ? str_or(r, "solver").c_str() : "");
      score_line("now:", r.value("before", json::object()));
      score_line("after:", r.value("after", json::object()));
      const json& moves = r.value("moves", json::array());
      std::printf("\n%zu moves\n", moves.size());
      for (const auto& m : moves)
        std::printf("  %-40s %s -> %s  (%s)\n", str_or(m, "task").c_str(),
                    str_or(m, "from").c_str(), str_or(m, "to").c_str(), str_or(m, "aim").c_str());
    });
    return 0;
  });
  h.on(status, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "rebalance.status", {{"name", o->entitlement}});
    print_json_or(g, r, [&] { print_status(r); });
    return 0;
  });
  for (bool paused : {true, false})
    h.on(paused ? pause : resume, [o, paused](const Globals& g) {
      json r = call_or_die(*cp_client(g), "rebalance.pause",
                           {{"name", o->entitlement}, {"paused", paused}});
      print_json_or(g, r, [&] {
        std::printf("entitlement %s: rebalancing %s\n", o->entitlement.c_str(),
                    paused ? "paused" : "resumed");
      });
      return 0;
    });
}

}  // namespace weft::cli
