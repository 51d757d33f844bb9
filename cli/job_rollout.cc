// weftctl job history, revert, promote and rollout pause/resume/abort: a job's revisions
// and its rolling update (docs/jobs.md).
#include "cli/cluster.h"

#include <cstdio>

namespace weft::cli {

namespace {

struct RolloutOptions {
  std::string name;
  uint64_t generation = 0;
  bool detach = false;
  int timeout_s = 600;
};

// A call that starts or changes an update, then its progress (unless --detach or --json).
int follow_call(const Globals& g, const RolloutOptions& o, const char* method, const json& params,
                const char* done) {
  auto cp = cp_client(g);
  json r = call_or_die(*cp, method, params);
  if (o.detach || g.json_out) {
    print_json_or(g, r, [&] { std::printf("job %s %s\n", o.name.c_str(), done); });
    return 0;
  }
  return follow_job(*cp, o.name, o.timeout_s, g.json_out);
}

}  // namespace

void add_job_rollout_commands(CLI::App* job, Handlers& h) {
  auto o = std::make_shared<RolloutOptions>();
  CLI::App* history =
      job->add_subcommand("history", "a job's last revisions: generation, when, by whom");
  history->add_option("name", o->name, "job name")->required();
  CLI::App* revert = job->add_subcommand(
      "revert", "a rolling update back to one of the job's revisions (weftctl job history)");
  revert->add_option("name", o->name, "job name")->required();
  revert->add_option("generation", o->generation, "the revision's generation")->required();
  CLI::App* promote =
      job->add_subcommand("promote", "the canaries are good: the update rolls on to every task");
  promote->add_option("name", o->name, "job name")->required();
  CLI::App* rollout =
      job->add_subcommand("rollout", "pause, resume or abort a job's rolling update");
  rollout->require_subcommand(1);
  CLI::App* pause =
      rollout->add_subcommand("pause", "no task is restarted for the update until resumed");
  CLI::App* resume = rollout->add_subcommand("resume", "the update rolls on");
  CLI::App* abort =
      rollout->add_subcommand("abort", "back to the revision before the current one, whole");
  for (CLI::App* cmd : {pause, resume, abort})
    cmd->add_option("name", o->name, "job name")->required();
  for (CLI::App* cmd : {revert, promote, abort, resume}) {
    cmd->add_flag("--detach", o->detach, "return at once instead of following the progress");
    cmd->add_option("--timeout", o->timeout_s, "seconds to follow (default 600)");
  }

  h.on(history, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "job.history", {{"name", o->name}});
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
  });
  h.on(revert, [o](const Globals& g) {
    return follow_call(g, *o, "job.revert", {{"name", o->name}, {"generation", o->generation}},
                       "reverting");
  });
  h.on(promote, [o](const Globals& g) {
    return follow_call(g, *o, "job.rollout", {{"name", o->name}, {"action", "promote"}},
                       "promoted");
  });
  h.on(abort, [o](const Globals& g) {
    return follow_call(g, *o, "job.rollout", {{"name", o->name}, {"action", "abort"}},
                       "rolling back");
  });
  h.on(resume, [o](const Globals& g) {
    return follow_call(g, *o, "job.rollout", {{"name", o->name}, {"action", "resume"}}, "resumed");
  });
  h.on(pause, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "job.rollout", {{"name", o->name}, {"action", "pause"}});
    print_json_or(g, r, [&] { std::printf("job %s: rollout paused\n", o->name.c_str()); });
    return 0;
  });
}

}  // namespace weft::cli
