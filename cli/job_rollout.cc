#include "cli/job_rollout.h"

#include <cstdio>

namespace weft::cli {

void add_job_rollout_commands(ClusterCommands& cluster, JobRolloutCommands& c) {
  CLI::App* job = cluster.job;
  c.history = job->add_subcommand("history", "a job's last revisions: generation, when, by whom");
  c.history->add_option("name", c.name, "job name")->required();
  c.revert = job->add_subcommand(
      "revert", "a rolling update back to one of the job's revisions (weftctl job history)");
  c.revert->add_option("name", c.name, "job name")->required();
  c.revert->add_option("generation", c.generation, "the revision's generation")->required();
  c.promote =
      job->add_subcommand("promote", "the canaries are good: the update rolls on to every task");
  c.promote->add_option("name", c.name, "job name")->required();
  c.rollout = job->add_subcommand("rollout", "pause, resume or abort a job's rolling update");
  c.rollout->require_subcommand(1);
  c.pause = c.rollout->add_subcommand("pause", "no task is restarted for the update until resumed");
  c.resume = c.rollout->add_subcommand("resume", "the update rolls on");
  c.abort =
      c.rollout->add_subcommand("abort", "back to the revision before the current one, whole");
  for (CLI::App* cmd : {c.pause, c.resume, c.abort})
    cmd->add_option("name", c.name, "job name")->required();
  for (CLI::App* cmd : {c.revert, c.promote, c.abort, c.resume}) {
    cmd->add_flag("--detach", c.detach, "return at once instead of following the progress");
    cmd->add_option("--timeout", c.timeout_s, "seconds to follow (default 600)");
  }
}

int run_job_rollout_commands(const JobRolloutCommands& c, const Globals& g) {
  if (!c.history) return -1;
  CpClient cp(g);
  auto follow = [&](const json& r, const char* done) {
    if (c.detach || g.json_out) {
      print_json_or(g, r, [&] { std::printf("job %s %s\n", c.name.c_str(), done); });
      return 0;
    }
    return follow_job(cp, c.name, c.timeout_s, g.json_out);
  };
  if (c.history->parsed()) {
    json r = call_or_die(cp, "job.history", {{"name", c.name}});
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {{"GENERATION", "WHEN", "NOTE", "COMMAND"}};
      uint64_t current = r.value("generation", uint64_t{0});
      for (const auto& rev : r.value("revisions", json::array())) {
        std::string argv;
        for (const auto& a : rev["spec"]["task"].value("argv", json::array()))
          argv += (argv.empty() ? "" : " ") + (a.is_string() ? a.get<std::string>() : a.dump());
        if (argv.size() > 60) argv = argv.substr(0, 57) + "...";
        std::string gen = str_or(rev, "generation");
        if (rev.value("generation", uint64_t{0}) == current) gen += " (current)";
        rows.push_back({gen, str_or(rev, "at"), str_or(rev, "note"), argv});
      }
      print_table(rows);
      if (r.value("paused", false))
        std::printf("its rollout is paused (weftctl job rollout resume)\n");
      if (r.value("canary", false))
        std::printf("its canaries wait for a promotion (weftctl job promote, or revert)\n");
    });
    return 0;
  }
  if (c.revert->parsed())
    return follow(call_or_die(cp, "job.revert", {{"name", c.name}, {"generation", c.generation}}),
                  "reverting");
  if (c.promote->parsed())
    return follow(call_or_die(cp, "job.rollout", {{"name", c.name}, {"action", "promote"}}),
                  "promoted");
  if (c.abort->parsed())
    return follow(call_or_die(cp, "job.rollout", {{"name", c.name}, {"action", "abort"}}),
                  "rolling back");
  if (c.resume->parsed())
    return follow(call_or_die(cp, "job.rollout", {{"name", c.name}, {"action", "resume"}}),
                  "resumed");
  if (c.pause->parsed()) {
    json r = call_or_die(cp, "job.rollout", {{"name", c.name}, {"action", "pause"}});
    print_json_or(g, r, [&] { std::printf("job %s: rollout paused\n", c.name.c_str()); });
    return 0;
  }
  return -1;
}

}  // namespace weft::cli
