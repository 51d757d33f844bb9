#include "cli/cluster.h"

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <time.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/job_file.h"
#include "common/task_state.h"
#include "common/units.h"

namespace weft::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<CpClient> cp_client(const Globals& g) {
  return std::make_unique<CpClient>(g);
}

void machine_table(const json& machines) {
  std::vector<std::vector<std::string>> rows = {
      {"MACHINE", "STATE", "ENTITLEMENT", "DOMAIN", "TASKS", "PROFILE", "CONNECTED"}};
  for (const auto& m : machines)
    rows.push_back({str_or(m, "machine"), str_or(m, "state"), str_or(m, "entitlement"),
                    str_or(m, "domain"), str_or(m, "tasks"), str_or(m, "profile"),
                    m.value("connected", false) ? "yes" : "no"});
  print_table(rows);
}

void task_table(const json& tasks) {
  std::vector<std::vector<std::string>> rows = {
      {"TASK", "JOB", "INDEX", "GENERATION", "MACHINE", "STATE", "MESSAGE"}};
  for (const auto& t : tasks)
    rows.push_back({str_or(t, "id"), str_or(t, "job"), str_or(t, "index"), str_or(t, "generation"),
                    str_or(t, "machine"), str_or(t, "state"), str_or(t, "message")});
  print_table(rows);
}

// What one poll of a follow found: a line for the operator (printed when it changes),
// its JSON form, and whether the operation is over.
struct Progress {
  std::string line;
  json j;
  enum class Verdict { kGoing, kDone, kFailed } verdict = Verdict::kGoing;
};

// Polls `poll` every 500 ms, printing each new picture, until it is done (0), failed
// (1) or the timeout passes (1; the control plane carries on).
int follow(const std::function<Progress()>& poll, int timeout_s, bool json_out,
           const std::string& then) {
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  std::string last;
  for (;;) {
    Progress p = poll();
    if (p.line != last) {
      std::cout << (json_out ? p.j.dump() : p.line) << "\n";
      std::cout.flush();
      last = p.line;
    }
    if (p.verdict == Progress::Verdict::kDone) return 0;
    if (p.verdict == Progress::Verdict::kFailed) return 1;
    if (Clock::now() > deadline) {
      std::cerr << "weftctl: gave up waiting after " << timeout_s
                << "s; the control plane carries on (" << then << ")\n";
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

TaskState state_of(const json& task) {
  return parse_task_state(task.value("state", "")).value_or(TaskState::kLost);
}

}  // namespace

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

json job_file_or_die(const std::string& path) {
  auto j = load_job_file(path);
  if (!j.ok()) die(j.error().str(), 2);
  return std::move(j).value();
}

}  // namespace

// One job's endpoints as rows: TASK INDEX MACHINE ADDRESS PORTS.
void endpoint_rows(const json& service, std::vector<std::vector<std::string>>* rows) {
  if (!service.is_object() || !service.contains("endpoints")) return;
  for (const auto& e : service["endpoints"]) {
    std::string ports;
    if (e.contains("ports"))
      for (const auto& [name, p] : e["ports"].items())
        ports += (ports.empty() ? "" : ",") + name + "=" + p.dump();
    rows->push_back({str_or(e, "task"), e.value("index", json(0)).dump(), str_or(e, "machine"),
                     str_or(e, "address"), ports.empty() ? "-" : ports});
  }
}

int run_service_command(const ClusterCommands& c, const Globals& g, CpClient& cp) {
  if (c.s_ls->parsed()) {
    json r = call_or_die(cp, "service.ls", json::object());
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {{"JOB", "ENTITLEMENT", "ENDPOINTS", "DNS"}};
      for (const auto& s : r["services"])
        rows.push_back(
            {str_or(s, "job"), str_or(s, "entitlement"), s["endpoints"].dump(), str_or(s, "dns")});
      print_table(rows);
      // An agent is behind when it has not acknowledged all it was sent (a control plane
      // before interest says only its version: behind the table's).
      size_t behind = 0, all = 0;
      for (const auto& a : r["agents"]) {
        if (!a.is_object()) continue;
        behind += a.contains("behind") ? a["behind"] == true : a["version"] != r["version"];
        all += a.value("jobs", json("all")) == "all";
      }
      std::cout << r["agents"].size() << " agent(s) answer DNS (" << all
                << " for every job, the others for the jobs their clients asked for); " << behind
                << " behind what they were sent; " << r["stops_waiting"]
                << " stop(s) waiting for them\n";
    });
    return 0;
  }
  if (c.s_show->parsed()) {
    json r = call_or_die(cp, "service.show", {{"job", c.name}});
    print_json_or(g, r, [&] {
      if (r.contains("dns")) std::cout << "dns: " << str_or(r, "dns") << "\n";
      std::vector<std::vector<std::string>> rows = {
          {"TASK", "INDEX", "MACHINE", "ADDRESS", "PORTS"}};
      endpoint_rows(r, &rows);
      print_table(rows);
    });
    return 0;
  }
  // watch: Consul-style blocking queries, each answered when something changed.
  uint64_t index = 0;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    json params{{"index", index}, {"wait_ms", 30000}};
    if (!c.name.empty()) params["job"] = c.name;
    if (c.watch_s > 0) {
      auto left = std::chrono::seconds(c.watch_s) - (std::chrono::steady_clock::now() - start);
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
      if (ms <= 0) return 0;
      params["wait_ms"] = std::min<int64_t>(ms, 30000);
    }
    json r = call_or_die(cp, "service.watch", params, 65000);
    uint64_t now = r.value("index", uint64_t{0});
    if (now != index || index == 0) {
      print_json_or(g, r, [&] {
        std::vector<std::vector<std::string>> rows = {
            {"TASK", "INDEX", "MACHINE", "ADDRESS", "PORTS"}};
        if (r.contains("service")) {
          std::cout << "== " << c.name << " (index " << now << ")\n";
          endpoint_rows(r["service"], &rows);
        } else {
          std::cout << "== every job (index " << now << ")\n";
          for (const auto& [job, s] : r["services"].items()) endpoint_rows(s, &rows);
        }
        print_table(rows);
      });
      std::cout.flush();
    }
    index = std::max(index, now);
  }
}

void add_cluster_commands(CLI::App& app, ClusterCommands& c) {
  auto wait_opts = [&c](CLI::App* cmd) {
    cmd->add_flag("--detach", c.detach, "return at once instead of following the progress");
    cmd->add_option("--timeout", c.timeout_s, "seconds to follow the progress (default 300)");
  };
  c.machine = app.add_subcommand("machine", "the cluster's machines (weft-controlplane)");
  c.machine->require_subcommand(1);
  c.m_ls = c.machine->add_subcommand("ls", "every machine with its state and entitlement");
  c.m_show = c.machine->add_subcommand("show", "one machine: health, profile, tasks, events");
  c.m_show->add_option("machine", c.name, "machine id")->required();
  c.m_drain = c.machine->add_subcommand(
      "drain", "move a machine's tasks elsewhere and take no new ones (maintenance)");
  c.m_drain->add_option("machine", c.name, "machine id")->required();
  c.m_drain->add_flag("--undo", c.undo, "put the machine back in service");
  wait_opts(c.m_drain);
  c.m_rm = c.machine->add_subcommand(
      "rm", "forget a machine that is gone (dead, its tasks moved); it returns if it registers");
  c.m_rm->add_option("machine", c.name, "machine id")->required();
  c.m_assign = c.machine->add_subcommand(
      "assign", "give an entitlement this machine (admin; it stays until released)");
  c.m_assign->add_option("machine", c.name, "machine id")->required();
  c.m_assign->add_option("entitlement", c.target, "entitlement name")->required();
  c.m_release = c.machine->add_subcommand(
      "release", "take an assigned machine back to the free pool once its tasks are gone (admin)");
  c.m_release->add_option("machine", c.name, "machine id")->required();

  c.ent = app.add_subcommand("entitlement", "entitlements: machine quotas with a host profile");
  c.ent->require_subcommand(1);
  c.e_create = c.ent->add_subcommand("create", "create an entitlement");
  c.e_create->add_option("name", c.name, "entitlement name")->required();
  c.e_create->add_option("--quota", c.quota, "most machines it may hold")->required();
  c.e_create->add_option("--profile", c.profile, "host profile its machines run (default: any)");
  c.e_create->add_option("--dc", c.dc, "only machines of this datacenter");
  c.e_create->add_option("--owner", c.owners,
                         "who may run jobs in it besides admins: CN=, OU=, O= or DNS= of their "
                         "certificate (repeatable)");
  c.e_owners = c.ent->add_subcommand("owners", "set who may run jobs in an entitlement (admin)");
  c.e_owners->add_option("name", c.name, "entitlement name")->required();
  c.e_owners->add_option("--owner", c.owners,
                         "CN=, OU=, O= or DNS= (repeatable; none: admins only)");

  c.e_grant = c.ent->add_subcommand(
      "grant",
      "set what its jobs' tasks may ask of the host (admin; replaces the grants; none: the "
      "restricted default; docs/security.md)");
  c.e_grant->add_option("name", c.name, "entitlement name")->required();
  c.e_grant->add_option("--user", c.g_users, "a user a task may run as (repeatable)");
  c.e_grant->add_option("--group", c.g_groups, "a group a task may run with (repeatable)");
  c.e_grant->add_option("--host-namespace", c.g_namespaces,
                        "pid, ipc, uts or mount: a namespace a task may share with the host "
                        "(repeatable)");
  c.e_grant->add_option("--host-path", c.g_paths,
                        "a host directory a task may bind in or use as its root (repeatable)");
  c.e_grant->add_flag("--seccomp-unconfined", c.g_seccomp, "tasks may turn seccomp off");
  c.e_grant->add_flag("--host-network", c.g_host_network,
                      "tasks may use the host's network (namespaces.network = \"host\"): "
                      "every port of the machine and what it serves on loopback");
  c.e_grant->add_flag("--low-ports", c.g_low_ports,
                      "a job may publish fixed ports below 1024 on its machines");
  c.e_grant->add_flag("--privileged", c.g_privileged,
                      "every host privilege but root and the sockets' group");

  c.e_update = c.ent->add_subcommand(
      "update",
      "change an entitlement's quota or host profile (admin; a profile rolls over its "
      "machines)");
  c.e_update->add_option("name", c.name, "entitlement name")->required();
  c.e_update->add_option("--quota", c.quota, "most machines it may hold")
      ->check(CLI::PositiveNumber);
  c.e_update->add_option("--profile", c.profile, "host profile its machines run (\"\": any)");
  c.e_update
      ->add_option("--max-unavailable", c.max_unavailable,
                   "machines applying the new profile at once (default 1)")
      ->check(CLI::PositiveNumber);
  wait_opts(c.e_update);
  c.e_rm = c.ent->add_subcommand("rm", "remove an entitlement without jobs (admin)");
  c.e_rm->add_option("name", c.name, "entitlement name")->required();

  c.e_ls = c.ent->add_subcommand("ls", "list entitlements");
  c.e_show = c.ent->add_subcommand("show", "one entitlement with its machines and jobs");
  c.e_show->add_option("name", c.name, "entitlement name")->required();

  c.job = app.add_subcommand("job", "jobs: a task spec run count times across the cluster");
  c.job->require_subcommand(1);
  c.j_create = c.job->add_subcommand("create", "create a job from a TOML job file");
  c.j_create->add_option("file", c.file, "job file (docs/jobs.md)")->required();
  wait_opts(c.j_create);
  c.j_ls = c.job->add_subcommand("ls", "list jobs");
  c.j_show = c.job->add_subcommand("show", "one job with its tasks");
  c.j_show->add_option("name", c.name, "job name")->required();
  c.j_scale = c.job->add_subcommand("scale", "change a job's task count");
  c.j_scale->add_option("name", c.name, "job name")->required();
  c.j_scale->add_option("count", c.count, "tasks")->required()->check(CLI::NonNegativeNumber);
  wait_opts(c.j_scale);
  c.j_update = c.job->add_subcommand("update", "rolling update to a new job file");
  c.j_update->add_option("file", c.file, "job file; its name picks the job")->required();
  wait_opts(c.j_update);
  c.j_stop = c.job->add_subcommand("stop", "stop every task of a job and forget it");
  c.j_stop->add_option("name", c.name, "job name")->required();
  c.j_logs = c.job->add_subcommand(
      "logs", "print a job task's output from its machine (through the control plane)");
  c.j_logs->add_option("name", c.name, "job name")->required();
  c.j_logs->add_option("--index", c.index, "the task's index (default 0)")
      ->check(CLI::NonNegativeNumber);
  c.j_logs->add_flag("-f,--follow", c.follow, "keep printing new output until the task ends");
  c.j_logs->add_option("--stream", c.stream, "stdout, stderr or all")
      ->check(CLI::IsMember({"stdout", "stderr", "all"}));
  c.j_logs->add_option("--tail", c.tail, "start this many lines before the end");
  c.j_logs->add_flag("--raw", c.raw,
                     "write the output's bytes as they are, also to a terminal (control "
                     "characters are otherwise shown as \\xNN)");

  c.svc = app.add_subcommand("service",
                             "service discovery: each job's ready tasks, their addresses and "
                             "ports (docs/services.md)");
  c.svc->require_subcommand(1);
  c.s_ls = c.svc->add_subcommand("ls", "every job with endpoints, and each agent's copy");
  c.s_show = c.svc->add_subcommand("show", "one job's endpoints: task, address, ports");
  c.s_show->add_option("job", c.name, "job name")->required();
  c.s_watch = c.svc->add_subcommand(
      "watch", "print a job's endpoints (or every job's), then again at each change");
  c.s_watch->add_option("job", c.name, "job name (default: every job)");
  c.s_watch->add_option("--for", c.watch_s, "stop after this many seconds");

  c.maint = app.add_subcommand("maintenance",
                               "planned maintenance: machines drained with notice, stopped at "
                               "the start, back in service after (docs/maintenance.md)");
  c.maint->require_subcommand(1);
  c.mt_schedule = c.maint->add_subcommand("schedule", "announce a maintenance window (admin)");
  c.mt_schedule->add_option("--machine", c.mt_machine, "one machine");
  c.mt_schedule->add_option("--domain", c.mt_domain, "every machine of a rack or MSB");
  c.mt_schedule->add_option("--dc", c.mt_dc, "every machine of a datacenter");
  c.mt_schedule
      ->add_option("--start", c.mt_start,
                   "when the machines go down: 2026-11-23T14:00:00Z (UTC), or +30m from now")
      ->required();
  c.mt_schedule->add_option("--duration", c.mt_duration, "how long (e.g. 30m, 2h)")->required();
  c.mt_schedule->add_option("--notice", c.mt_notice,
                            "drain and tell TaskControllers this long before (default 15m)");
  c.mt_schedule->add_option("--reason", c.mt_reason, "what is done (kernel upgrade, ...)");
  c.mt_schedule->add_flag("--reboot", c.mt_reboot,
                          "reboot each machine once it runs nothing (sidekick allow_reboot)");
  c.mt_ls = c.maint->add_subcommand("ls", "maintenance events not yet ended");
  c.mt_ls->add_flag("--all", c.mt_all, "ended ones too");
  c.mt_cancel = c.maint->add_subcommand("cancel", "end an event now: its machines return (admin)");
  c.mt_cancel->add_option("id", c.mt_id, "event id")->required();

  c.web =
      app.add_subcommand("web",
                         "the fleet as a web page (HTML and SVG, no script) over your certificate; "
                         "docs/web-view.md");
  c.web->add_option("-o,--output", c.file, "write it to this file (default: standard output)");
  c.audit = app.add_subcommand("audit", "the control plane's audit log");
  c.audit->require_subcommand(1);
  c.a_ls = c.audit->add_subcommand("ls", "operator calls that changed the cluster or were refused");
  c.a_ls->add_option("--since", c.since, "only entries this recent (e.g. 30m, 2h, 7d)");
  c.a_ls->add_option("--limit", c.limit, "at most this many, the latest (default 1000)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  c.cp = app.add_subcommand("controlplane", "the control plane's replicas (docs/replicas.md)");
  c.cp->require_subcommand(1);
  c.cp_status = c.cp->add_subcommand(
      "status", "each replica given (--controlplane): whether it leads, and which one does");
}

// A region's front end answers a listing with what it could reach: the shards it could
// not (`unreachable`) and a list cut short (`truncated`) are said on stderr, so a table
// with rows missing never passes for the whole.
static void warn_partial(const json& r, const char* what) {
  if (r.contains("unreachable") && r["unreachable"].is_array())
    for (const auto& u : r["unreachable"])
      std::cerr << "weftctl: shard " << str_or(u, "shard") << " did not answer, its " << what
                << " are not listed: " << str_or(u, "error") << "\n";
  if (r.value("truncated", false))
    std::cerr << "weftctl: the list of " << what << " is cut short (a shard has more)\n";
}

int cluster_task_ls(const Globals& g) {
  auto c = cp_client(g);
  json r = call_or_die(*c, "task.ls", json::object());
  print_json_or(g, r, [&] {
    task_table(r["tasks"]);
    warn_partial(r, "tasks");
  });
  return 0;
}

int cluster_logs(const Globals& g, const json& target, LogOptions o) {
  auto c = cp_client(g);
  o.long_poll = true;
  return stream_logs(c->raw(), target, o);
}

int run_cluster_commands(const ClusterCommands& c, const Globals& g) {
  if (c.web && c.web->parsed()) {
    auto cp = cp_client(g);
    json r = call_or_die(*cp, "web.page", json::object());
    std::string html = r.value("html", "");
    if (c.file.empty() || c.file == "-") {
      std::cout << html;
      return 0;
    }
    if (auto s = write_file_atomic(c.file, html, 0644); !s.ok()) die(s.error().str());
    std::cerr << "weftctl: the fleet's page is in " << c.file << "\n";
    return 0;
  }
  if (c.j_logs && c.j_logs->parsed())
    return cluster_logs(g, {{"job", c.name}, {"index", c.index}},
                        {c.stream, c.follow, c.tail, g.json_out, true, c.raw});
  if (c.cp_status->parsed()) {
    json r = controlplane_statuses(g);
    int leaders = 0;
    for (const auto& row : r) leaders += row.value("leading", false);
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {{"ENDPOINT", "STORE", "LEADING", "LEADER"}};
      for (const auto& row : r)
        rows.push_back({str_or(row, "endpoint"), str_or(row, "store"),
                        row.contains("error")         ? "error: " + str_or(row, "error")
                        : row.value("leading", false) ? "yes"
                                                      : "no",
                        str_or(row, "leader")});
      print_table(rows);
    });
    return leaders == 1 ? 0 : 1;  // none (a failover, no etcd) or, never, two
  }
  if (!c.machine->parsed() && !c.ent->parsed() && !c.job->parsed() && !c.audit->parsed() &&
      !c.maint->parsed() && !c.svc->parsed())
    return -1;
  auto cp = cp_client(g);
  if (c.svc->parsed()) return run_service_command(c, g, *cp);
  if (c.m_ls->parsed()) {
    // Page by page (machine.ls answers at most 1000 machines at a time; through a
    // region's front end, `next` is each shard's cursor). What the front end could not
    // reach is kept and said, never dropped.
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
  } else if (c.m_rm->parsed()) {
    json r = call_or_die(*cp, "machine.rm", {{"machine", c.name}});
    print_json_or(g, r, [&] { std::cout << c.name << " removed\n"; });
  } else if (c.m_show->parsed()) {
    json r = call_or_die(*cp, "machine.show", {{"machine", c.name}});
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
  } else if (c.m_drain->parsed()) {
    json r = call_or_die(*cp, "machine.drain", {{"machine", c.name}, {"drained", !c.undo}});
    if (c.undo || c.detach) {
      print_json_or(
          g, r, [&] { std::cout << c.name << (c.undo ? " back in service\n" : " draining\n"); });
      return 0;
    }
    return follow_drain(*cp, c.name, c.timeout_s, g.json_out);
  } else if (c.m_assign->parsed()) {
    json r = call_or_die(*cp, "machine.assign", {{"machine", c.name}, {"entitlement", c.target}});
    print_json_or(g, r, [&] {
      std::cout << c.name << " assigned to " << c.target << " (profile "
                << str_or(r, "profile", "any") << ")\n";
    });
  } else if (c.m_release->parsed()) {
    json r = call_or_die(*cp, "machine.release", {{"machine", c.name}});
    print_json_or(g, r, [&] {
      if (r.value("free", false))
        std::cout << c.name << " is in the free pool\n";
      else
        std::cout << c.name << " returns to the free pool when its " << str_or(r, "tasks")
                  << " tasks are gone\n";
    });
  } else if (c.e_update->parsed()) {
    json p{{"name", c.name}};
    if (c.e_update->count("--quota")) p["quota"] = c.quota;
    if (c.e_update->count("--profile")) p["profile"] = c.profile;
    if (c.e_update->count("--max-unavailable")) p["max_unavailable"] = c.max_unavailable;
    if (p.size() == 1) die("entitlement update needs --quota or --profile", 2);
    json r = call_or_die(*cp, "entitlement.update", p);
    if (c.detach || !r.contains("profile_roll")) {
      print_json_or(g, r, [&] {
        std::cout << "entitlement " << c.name << ": quota " << str_or(r, "quota") << ", profile "
                  << str_or(r, "profile", "any") << ", " << str_or(r, "machines") << " machines\n";
      });
      return 0;
    }
    return follow_profile_roll(*cp, c.name, c.timeout_s, g.json_out);
  } else if (c.e_rm->parsed()) {
    json r = call_or_die(*cp, "entitlement.rm", {{"name", c.name}});
    print_json_or(g, r, [&] { std::cout << "entitlement " << c.name << " removed\n"; });
  } else if (c.e_create->parsed()) {
    json p{{"name", c.name}, {"quota", c.quota}};
    if (c.quota < 1) die("--quota must be at least 1", 2);
    if (!c.profile.empty()) p["profile"] = c.profile;
    if (!c.dc.empty()) p["dc"] = c.dc;
    if (!c.owners.empty()) p["owners"] = c.owners;
    json r = call_or_die(*cp, "entitlement.create", p);
    print_json_or(g, r, [&] { std::cout << "entitlement " << c.name << " created\n"; });
  } else if (c.e_owners->parsed()) {
    json r = call_or_die(*cp, "entitlement.update", {{"name", c.name}, {"owners", c.owners}});
    print_json_or(g, r, [&] {
      std::string list;
      for (const auto& o : c.owners) list += " " + o;
      std::cout << "entitlement " << c.name
                << " owners:" << (list.empty() ? " (admins only)" : list) << "\n";
    });
  } else if (c.e_grant->parsed()) {
    json grants = json::object();
    if (c.g_privileged) grants["privileged"] = true;
    if (c.g_seccomp) grants["seccomp_unconfined"] = true;
    if (c.g_host_network) grants["host_network"] = true;
    if (c.g_low_ports) grants["low_ports"] = true;
    for (auto [key, v] : {std::pair{"users", &c.g_users},
                          {"groups", &c.g_groups},
                          {"host_namespaces", &c.g_namespaces},
                          {"host_paths", &c.g_paths}})
      if (!v->empty()) grants[key] = *v;
    json r = call_or_die(*cp, "entitlement.update", {{"name", c.name}, {"grants", grants}});
    print_json_or(g, r, [&] {
      std::cout << "entitlement " << c.name
                << " grants: " << (r["grants"].empty() ? "none (restricted)" : r["grants"].dump())
                << "\n";
    });
  } else if (c.mt_schedule->parsed()) {
    json p{{"start", c.mt_start}, {"duration", c.mt_duration}, {"reboot", c.mt_reboot}};
    int targets = 0;
    for (auto [key, v] :
         {std::pair{"machine", &c.mt_machine}, {"domain", &c.mt_domain}, {"dc", &c.mt_dc}})
      if (!v->empty()) {
        p[key] = *v;
        ++targets;
      }
    if (targets != 1) die("give exactly one of --machine, --domain or --dc", 2);
    if (!c.mt_notice.empty()) p["notice"] = c.mt_notice;
    if (!c.mt_reason.empty()) p["reason"] = c.mt_reason;
    json r = call_or_die(*cp, "maintenance.schedule", p);
    print_json_or(g, r, [&] {
      std::cout << "maintenance " << r.value("id", uint64_t{0})
                << " scheduled: " << str_or(r, "target_kind") << " " << str_or(r, "target")
                << " from " << str_or(r, "start") << " to " << str_or(r, "end") << "\n";
    });
  } else if (c.mt_ls->parsed()) {
    json r = call_or_die(*cp, "maintenance.ls", {{"all", c.mt_all}});
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {
          {"ID", "TARGET", "START", "END", "STATE", "MACHINES", "REBOOT", "REASON", "WAITING"}};
      for (const auto& e : r["events"])
        rows.push_back({std::to_string(e.value("id", uint64_t{0})),
                        str_or(e, "target_kind") + " " + str_or(e, "target"), str_or(e, "start"),
                        str_or(e, "end"), str_or(e, "state"),
                        std::to_string(e.value("machines", json::array()).size()),
                        e.value("reboot", false) ? "yes" : "no", str_or(e, "reason"),
                        str_or(e, "message")});
      print_table(rows);
    });
  } else if (c.mt_cancel->parsed()) {
    json r = call_or_die(*cp, "maintenance.cancel", {{"id", c.mt_id}});
    print_json_or(g, r, [&] { std::cout << "maintenance " << c.mt_id << " cancelled\n"; });
  } else if (c.a_ls->parsed()) {
    json p{{"limit", c.limit}};
    if (!c.since.empty()) {
      auto us = parse_duration_us(c.since);
      if (!us.ok()) die("--since: " + us.error().str(), 2);
      int64_t now = static_cast<int64_t>(now_realtime_us());
      p["since_wall_us"] = std::max<int64_t>(0, now - static_cast<int64_t>(*us));
    }
    json r = call_or_die(*cp, "audit.ls", p);
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {
          {"TIME", "WHO", "ROLE", "METHOD", "TARGET", "RESULT"}};
      for (const auto& e : r["entries"]) {
        time_t t = static_cast<time_t>(e.value("at_wall_us", int64_t{0}) / 1'000'000);
        char when[32] = "-";
        struct tm tmv;
        if (gmtime_r(&t, &tmv)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
        rows.push_back({when, str_or(e, "who"), str_or(e, "role"), str_or(e, "method"),
                        str_or(e, "target"), str_or(e, "result")});
      }
      print_table(rows);
    });
  } else if (c.e_ls->parsed()) {
    json r = call_or_die(*cp, "entitlement.ls", json::object());
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
  } else if (c.e_show->parsed()) {
    json r = call_or_die(*cp, "entitlement.show", {{"name", c.name}});
    print_json_or(g, r, [&] {
      json head = r;
      head.erase("machines");
      print_kv(head);
      std::cout << "\n";
      machine_table(r["machines"]);
    });
  } else if (c.j_create->parsed() || c.j_update->parsed()) {
    json spec = job_file_or_die(c.file);
    bool create = c.j_create->parsed();
    json r = call_or_die(*cp, create ? "job.create" : "job.update", spec);
    std::string name = spec["name"];
    if (c.detach) {
      print_json_or(g, r, [&] {
        std::cout << "job " << name << (create ? " created" : " updating") << "\n";
      });
      return 0;
    }
    return follow_job(*cp, name, c.timeout_s, g.json_out);
  } else if (c.j_ls->parsed()) {
    json r = call_or_die(*cp, "job.ls", json::object());
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
  } else if (c.j_show->parsed()) {
    json r = call_or_die(*cp, "job.show", {{"name", c.name}});
    print_json_or(g, r, [&] {
      const json& s = r["spec"];
      std::cout << "job: " << c.name << "\nentitlement: " << str_or(r, "entitlement")
                << "\ncount: " << str_or(s, "count") << "\ngeneration: " << str_or(r, "generation")
                << "\nmax_unavailable: " << str_or(s, "max_unavailable")
                << "\nnetwork: " << str_or(r, "network") << " (" << str_or(r, "network_detail")
                << ")"
                << "\nper task: " << str_or(s["per_task"], "cpu_milli") << " millicores, "
                << str_or(s["per_task"], "mem_mb") << " MiB\n";
      if (s.contains("autoscale") && s["autoscale"].is_object()) {
        const json& a = s["autoscale"];
        std::cout << "autoscale: " << str_or(a, "min") << " to " << str_or(a, "max") << " tasks, "
                  << str_or(a, "metric") << " at " << str_or(a, "target") << " a task"
                  << (a.value("paused", false) ? " (paused)" : "")
                  << " (weftctl job autoscale show " << c.name << ")\n";
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
  } else if (c.j_scale->parsed()) {
    json r = call_or_die(*cp, "job.scale", {{"name", c.name}, {"count", c.count}});
    if (c.detach) {
      print_json_or(g, r, [&] { std::cout << "job " << c.name << " scaling\n"; });
      return 0;
    }
    return follow_job(*cp, c.name, c.timeout_s, g.json_out);
  } else if (c.j_stop->parsed()) {
    json r = call_or_die(*cp, "job.stop", {{"name", c.name}});
    print_json_or(g, r, [&] { std::cout << "job " << c.name << " stopping\n"; });
  }
  return 0;
}

}  // namespace weft::cli
