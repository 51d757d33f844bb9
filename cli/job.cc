// weftctl job: a task spec run count times across the cluster (create, ls, show, scale,
// update, stop, logs; rollouts in job_rollout.cc, events in job_events.cc, autoscaling in
// autoscale.cc).
#include "cli/cluster.h"

#include <map>
#include <set>

#include "common/job_file.h"

namespace weft::cli {

// Follows a job until every task runs its current generation (create, scale, update).
// Tasks whose start their machine refused are printed with the machine's message; when
// nothing else is in flight the follow ends there, failed.
int follow_job(CpClient& c, const std::string& name, int timeout_s, bool json_out) {
  std::set<std::string> told;  // refusals already printed
  auto poll = [&]() -> Progress {
    json r = call_or_die(c, "job.show", {{"name", name}});
    Progress p;
    if (r.contains("periodic") && r["periodic"].is_object()) {  // its runs come at their times
      p.line = "periodic job " + name + ": next run " + str_or(r["periodic"], "next_period");
      p.j = r["periodic"];
      p.verdict = Progress::Verdict::kDone;
      return p;
    }
    if (r.contains("batch") && r["batch"].is_object()) {  // until it ends
      const json& b = r["batch"];
      int running = 0;
      for (const auto& t : r["tasks"]) running += state_of(t) == TaskState::kRunning;
      std::string outcome = b.value("outcome", "running");
      p.line = "batch job " + name + ": " + str_or(b, "succeeded") + "/" +
               str_or(b, "completions") + " completed, " + str_or(b, "failed") + " failed, " +
               std::to_string(running) + " running";
      if (outcome != "running") p.line += "; " + outcome + ": " + b.value("reason", "");
      p.j = b;
      if (outcome == "succeeded") p.verdict = Progress::Verdict::kDone;
      if (outcome == "failed") p.verdict = Progress::Verdict::kFailed;
      return p;
    }
    int want = r["spec"].value("count", 0);
    uint64_t gen = r.value("generation", uint64_t{0});
    std::map<std::string, int> at_gen;
    int ready = 0, running = 0, old_live = 0, refused = 0;
    json messages = json::array();
    for (const auto& t : r["tasks"]) {
      TaskState st = state_of(t);
      bool current = t.value("generation", uint64_t{0}) == gen;
      if (current) at_gen[task_state_name(st)]++;
      if (current && st == TaskState::kRunning) running++;
      // Available: running and its readiness check passes (a control plane older than
      // readiness checks does not say: running then counts).
      if (current && st == TaskState::kRunning && t.value("ready", true)) ready++;
      std::string msg = t.value("message", "");
      if (current && st == TaskState::kFailed && !msg.empty()) {
        refused++;
        messages.push_back({{"task", t.value("id", "")}, {"message", msg}});
        if (told.insert(t.value("id", "")).second && !json_out)
          std::cerr << "weftctl: task " << t.value("id", "") << " failed on "
                    << t.value("machine", "?") << ": " << msg << "\n";
      }
      if (!current && (st == TaskState::kRunning || st == TaskState::kStarting ||
                       st == TaskState::kStopping || st == TaskState::kPending))
        old_live++;
    }
    p.line = "job " + name + " generation " + std::to_string(gen) + ": " + std::to_string(ready) +
             "/" + std::to_string(want) + " ready";
    if (running > ready) p.line += ", " + std::to_string(running - ready) + " running not ready";
    for (const auto& [st, n] : at_gen)
      if (st != "running") p.line += ", " + std::to_string(n) + " " + st;
    if (old_live) p.line += "; " + std::to_string(old_live) + " of the previous generation left";
    p.j = {{"job", name},   {"generation", gen},         {"running", running}, {"ready", ready},
           {"count", want}, {"previous_left", old_live}, {"refused", messages}};
    if (ready == want && old_live == 0) p.verdict = Progress::Verdict::kDone;
    // Every index runs or was refused, and nothing of the old generation is left: the
    // refused ones wait for a fixed spec (weftctl job update).
    if (refused > 0 && ready + refused >= want && old_live == 0)
      p.verdict = Progress::Verdict::kFailed;
    return p;
  };
  return follow(poll, timeout_s, json_out, "weftctl job show " + name);
}

namespace {

struct JobOptions {
  std::string name, file;
  int64_t count = 0;
  FollowOptions follow;
  // logs
  int64_t index = 0, tail = -1;
  std::string stream = "all";
  bool follow_logs = false, raw = false;
};

json job_file_or_die(const std::string& path) {
  auto j = load_job_file(path);
  if (!j.ok()) die(j.error().str(), 2);
  return std::move(j).value();
}

// create and update: the file's job, then its progress.
int job_apply(const Globals& g, const JobOptions& o, bool create) {
  json spec = job_file_or_die(o.file);
  auto cp = cp_client(g);
  json r = call_or_die(*cp, create ? "job.create" : "job.update", spec);
  std::string name = spec["name"];
  if (o.follow.detach) {
    print_json_or(
        g, r, [&] { std::cout << "job " << name << (create ? " created" : " updating") << "\n"; });
    return 0;
  }
  return follow_job(*cp, name, o.follow.timeout_s, g.json_out);
}

int job_ls(const Globals& g) {
  json r = call_or_die(*cp_client(g), "job.ls", json::object());
  print_json_or(g, r, [&] {
    warn_partial(r, "jobs");
    std::vector<std::vector<std::string>> rows = {
        {"JOB", "ENTITLEMENT", "COUNT", "RUNNING", "GENERATION", "STATE"}};
    for (const auto& j : r["jobs"]) {
      // A batch job's state is its progress; a periodic job's, that it is one.
      std::string state = j.value("stopping", false) ? "stopping" : "active";
      std::string kind = j.value("kind", "");
      if (kind == "periodic" && state == "active") state = "periodic";
      if (kind == "batch" && state == "active")
        state = (j.value("outcome", "").empty() ? std::string("running") : str_or(j, "outcome")) +
                " " + str_or(j, "succeeded") + "/" + str_or(j, "completions");
      rows.push_back({str_or(j, "name"), str_or(j, "entitlement"), str_or(j, "count"),
                      str_or(j, "running"), str_or(j, "generation"), state});
    }
    print_table(rows);
  });
  return 0;
}

int job_show(const Globals& g, const std::string& name) {
  json r = call_or_die(*cp_client(g), "job.show", {{"name", name}});
  print_json_or(g, r, [&] {
    const json& s = r["spec"];
    std::cout << "job: " << name << "\nentitlement: " << str_or(r, "entitlement")
              << "\ncount: " << str_or(s, "count") << "\ngeneration: " << str_or(r, "generation")
              << "\nmax_unavailable: " << str_or(s, "max_unavailable")
              << "\nnetwork: " << str_or(r, "network") << " (" << str_or(r, "network_detail") << ")"
              << "\nper task: " << str_or(s["per_task"], "cpu_milli") << " millicores, "
              << str_or(s["per_task"], "mem_mb") << " MiB\n";
    if (s.contains("autoscale") && s["autoscale"].is_object()) {
      const json& a = s["autoscale"];
      std::cout << "autoscale: " << str_or(a, "min") << " to " << str_or(a, "max") << " tasks, "
                << str_or(a, "metric") << " at " << str_or(a, "target") << " a task"
                << (a.value("paused", false) ? " (paused)" : "") << " (weftctl job autoscale show "
                << name << ")\n";
    }
    if (r.contains("batch") && r["batch"].is_object()) {
      const json& b = r["batch"];
      std::cout << "batch: " << str_or(b, "succeeded") << "/" << str_or(b, "completions")
                << " completed, " << str_or(b, "failed") << " failed (max_failures "
                << str_or(b, "max_failures") << "), parallelism " << str_or(b, "parallelism")
                << "\noutcome: " << str_or(b, "outcome");
      if (!b.value("reason", "").empty()) std::cout << " (" << str_or(b, "reason") << ")";
      std::cout << "\n";
      if (b.contains("deadline")) std::cout << "deadline: " << str_or(b, "deadline") << "\n";
      if (b.contains("periodic_job"))
        std::cout << "a run of periodic job: " << str_or(b, "periodic_job") << "\n";
    }
    if (r.contains("periodic") && r["periodic"].is_object()) {
      const json& pj = r["periodic"];
      std::cout << "periodic: " << str_or(pj, "schedule") << " (UTC), overlap "
                << str_or(pj, "overlap") << "\nlast period: " << str_or(pj, "last_period")
                << "\nnext period: " << str_or(pj, "next_period") << "\nruns:";
      for (const auto& run : pj.value("runs", json::array()))
        std::cout << " " << str_or(run, "job") << " (" << str_or(run, "outcome") << ")";
      std::cout << "\n";
    }
    if (r.contains("task_controller") && r["task_controller"].is_object()) {
      const json& tc = r["task_controller"];
      std::cout << "task controller: " << str_or(tc, "address")
                << (tc.value("unreachable", false) ? " (unreachable" : " (answering")
                << (tc.value("fallback", false) ? ", max_unavailable pacing)" : ")") << ", "
                << tc.value("pending", json::array()).size() << " operations waiting\n";
    }
    std::cout << "command:";
    for (const auto& a : s["task"].value("argv", json::array()))
      std::cout << " " << a.get<std::string>();
    std::cout << "\n\n";
    task_table(r["tasks"]);
  });
  return 0;
}

}  // namespace

CLI::App* add_job_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<JobOptions>();
  CLI::App* job = app.add_subcommand("job", "jobs: a task spec run count times across the cluster");
  job->require_subcommand(1);

  CLI::App* create = job->add_subcommand("create", "create a job from a TOML job file");
  create->add_option("file", o->file, "job file (docs/jobs.md)")->required();
  add_follow_options(create, o->follow);
  h.on(create, [o](const Globals& g) { return job_apply(g, *o, true); });

  h.on(job->add_subcommand("ls", "list jobs"), job_ls);

  CLI::App* sh = job->add_subcommand("show", "one job with its tasks");
  sh->add_option("name", o->name, "job name")->required();
  h.on(sh, [o](const Globals& g) { return job_show(g, o->name); });

  CLI::App* scale = job->add_subcommand("scale", "change a job's task count");
  scale->add_option("name", o->name, "job name")->required();
  scale->add_option("count", o->count, "tasks")->required()->check(CLI::NonNegativeNumber);
  add_follow_options(scale, o->follow);
  h.on(scale, [o](const Globals& g) {
    auto cp = cp_client(g);
    json r = call_or_die(*cp, "job.scale", {{"name", o->name}, {"count", o->count}});
    if (o->follow.detach) {
      print_json_or(g, r, [&] { std::cout << "job " << o->name << " scaling\n"; });
      return 0;
    }
    return follow_job(*cp, o->name, o->follow.timeout_s, g.json_out);
  });

  CLI::App* update = job->add_subcommand("update", "rolling update to a new job file");
  update->add_option("file", o->file, "job file; its name picks the job")->required();
  add_follow_options(update, o->follow);
  h.on(update, [o](const Globals& g) { return job_apply(g, *o, false); });

  CLI::App* stop = job->add_subcommand("stop", "stop every task of a job and forget it");
  stop->add_option("name", o->name, "job name")->required();
  h.on(stop, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "job.stop", {{"name", o->name}});
    print_json_or(g, r, [&] { std::cout << "job " << o->name << " stopping\n"; });
    return 0;
  });

  CLI::App* logs = job->add_subcommand(
      "logs", "print a job task's output from its machine (through the control plane)");
  logs->add_option("name", o->name, "job name")->required();
  logs->add_option("--index", o->index, "the task's index (default 0)")
      ->check(CLI::NonNegativeNumber);
  logs->add_flag("-f,--follow", o->follow_logs, "keep printing new output until the task ends");
  logs->add_option("--stream", o->stream, "stdout, stderr or all")
      ->check(CLI::IsMember({"stdout", "stderr", "all"}));
  logs->add_option("--tail", o->tail, "start this many lines before the end");
  logs->add_flag("--raw", o->raw,
                 "write the output's bytes as they are, also to a terminal (control "
                 "characters are otherwise shown as \\xNN)");
  h.on(logs, [o](const Globals& g) {
    return cluster_logs(g, {{"job", o->name}, {"index", o->index}},
                        {o->stream, o->follow_logs, o->tail, g.json_out, true, o->raw});
  });
  return job;
}

}  // namespace weft::cli
