// weftctl job autoscale: a job's autoscaling, what it measures and would do, pause and
// resume (docs/jobs.md, "Autoscaling").
#include "cli/cluster.h"

#include <iostream>

namespace weft::cli {

namespace {

std::string figure(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v.get<double>());
  return buf;
}

void print_show(const json& r) {
  const json& s = r.value("settings", json::object());
  std::string unit = str_or(r, "unit");
  std::cout << "job: " << str_or(r, "job") << (r.value("paused", false) ? " (paused)" : "")
            << "\ncount: " << str_or(r, "count") << " (min " << str_or(s, "min") << ", max "
            << str_or(s, "max") << ")"
            << "\nmetric: " << str_or(s, "metric") << ", target " << figure(s["target"])
            << " of the reservation = " << figure(r["target_per_task"]) << " " << unit
            << " a task, tolerance " << figure(s["tolerance"])
            << "\nscale-down window: " << str_or(s, "scale_down_window")
            << (s.value("predictive", false) ? ", predictive" : "") << "\n";
  const json& m = r["measured"];
  if (m.is_object())
    std::cout << "load: " << figure(m["load"]) << " " << unit << " over " << str_or(m, "ready")
              << " ready tasks (" << figure(m["load_per_task"]) << " a task; "
              << str_or(m, "tasks_measured") << " measured)\n";
  else
    std::cout << "load: not measured yet\n";
  const json& d = r["decision"];
  if (d.is_object())
    std::cout << (r.value("paused", false) ? "would resize to: " : "wants: ")
              << str_or(d, "desired") << " (" << str_or(d, "reason") << ")\n";
  const json& changes = r.value("changes", json::array());
  if (!changes.empty()) {
    std::cout << "\nchanges (newest last):\n";
    for (const auto& ch : changes)
      std::cout << "  " << str_or(ch, "from") << " -> " << str_or(ch, "to") << "  "
                << str_or(ch, "result") << "  " << str_or(ch, "reason") << "\n";
  }
}

}  // namespace

void add_autoscale_commands(CLI::App* job, Handlers& h) {
  auto name = std::make_shared<std::string>();
  CLI::App* group = job->add_subcommand(
      "autoscale", "a job's autoscaling: what it measures and would do, pause and resume");
  group->require_subcommand(1);
  CLI::App* show = group->add_subcommand(
      "show", "the job's settings, latest load, what autoscaling would do now, and its changes");
  CLI::App* pause = group->add_subcommand(
      "pause", "keep measuring and deciding but resize nothing (kept across restarts)");
  CLI::App* resume = group->add_subcommand("resume", "let autoscaling resize the job again");
  for (CLI::App* sub : {show, pause, resume})
    sub->add_option("name", *name, "job name")->required();
  h.on(show, [name](const Globals& g) {
    json r = call_or_die(*cp_client(g), "job.autoscale", {{"name", *name}});
    print_json_or(g, r, [&] { print_show(r); });
    return 0;
  });
  for (bool paused : {true, false})
    h.on(paused ? pause : resume, [name, paused](const Globals& g) {
      json r =
          call_or_die(*cp_client(g), "job.autoscale.pause", {{"name", *name}, {"paused", paused}});
      print_json_or(g, r, [&] {
        std::cout << "job " << *name << " autoscaling " << (paused ? "paused" : "resumed") << "\n";
      });
      return 0;
    });
}

}  // namespace weft::cli
