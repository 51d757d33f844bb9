// weftctl: the operator CLI. Every command talks to a daemon over the line protocol
// and takes --json to print the daemon's reply as JSON instead of a table.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/cluster.h"
#include "cli/util.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/rpc.h"

using json = nlohmann::json;
using namespace weft;
using namespace weft::cli;

namespace {

// Prints a switch/verify/off report and returns its exit code: 0 ok, 1 failed,
// 3 degraded, 4 reboot required, 5 drift.
int report_profile(const json& r, bool as_json) {
  if (as_json) {
    std::cout << r.dump(2) << "\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"KNOB", "STATUS", "FROM", "TO", "SOURCE"}};
    for (const auto& k : r.value("knobs", json::array()))
      rows.push_back({str_or(k, "id"), str_or(k, "status"), str_or(k, "from"), str_or(k, "to"),
                      str_or(k, "source")});
    if (rows.size() > 1) print_table(rows);
    std::cout << "outcome: " << r.value("outcome", "?");
    if (r.contains("error")) std::cout << ": " << r["error"].get<std::string>();
    std::cout << "\n";
  }
  return r.value("exit_code", 1);
}

struct RunOptions {
  std::string name, cpu, memory, memory_high, swap, cwd, user, group, rootfs, hostname;
  std::string net = "host", restart = "never", restart_delay, restart_max_delay, restart_reset;
  std::string stop_signal, stop_grace, log_max_size, cpuset_cpus, cpuset_mems, spec_file;
  int64_t cpu_weight = 0, pids = 0, max_restarts = -2, log_max_files = 0;
  std::vector<std::string> env, io_max, hugetlb, share, argv;
  bool best_effort = false;
};

// Builds the task.run params from flags; a --spec file is the base and flags override.
json build_spec(const RunOptions& o) {
  json s = json::object();
  if (!o.spec_file.empty()) {
    auto text = read_file_bounded(o.spec_file, kMaxTomlBytes);
    if (!text.ok()) die(text.error().str(), 2);
    auto parsed = parse_json_bounded(*text);
    if (!parsed.ok()) die(o.spec_file + ": " + parsed.error().str(), 2);
    s = std::move(parsed).value();
    if (!s.is_object()) die(o.spec_file + ": not a JSON object", 2);
  }
  if (!o.argv.empty()) s["argv"] = o.argv;
  if (!o.name.empty()) s["name"] = o.name;
  if (!s.contains("name") && s.contains("argv") && s["argv"].is_array() && !s["argv"].empty() &&
      s["argv"][0].is_string()) {
    std::string b = s["argv"][0].get<std::string>();
    b = b.substr(b.rfind('/') + 1);
    std::string clean;
    for (char c : b)
      clean += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '-';
    s["name"] = (clean.empty() ? "task" : clean) + "-" + random_hex(3);
  }
  for (const auto& e : o.env) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0) die("--env " + e + ": expected NAME=VALUE", 2);
    s["env"][e.substr(0, eq)] = e.substr(eq + 1);
  }
  if (!o.cwd.empty()) s["cwd"] = o.cwd;
  if (!o.user.empty()) s["user"] = o.user;
  if (!o.group.empty()) s["group"] = o.group;
  if (!o.rootfs.empty()) s["rootfs"] = o.rootfs;
  if (!o.hostname.empty()) s["hostname"] = o.hostname;
  json& r = s["resources"];
  if (!r.is_object()) r = json::object();
  if (!o.cpu.empty()) {
    char* end = nullptr;
    double v = std::strtod(o.cpu.c_str(), &end);
    if (*end) die("--cpu " + o.cpu + ": expected a number of cores such as 0.5", 2);
    r["cpu"] = v;
  }
  if (o.cpu_weight) r["cpu_weight"] = o.cpu_weight;
  if (!o.memory.empty()) r["memory_max"] = o.memory;
  if (!o.memory_high.empty()) r["memory_high"] = o.memory_high;
  if (!o.swap.empty()) r["memory_swap_max"] = o.swap;
  if (o.pids) r["pids_max"] = o.pids;
  for (const auto& io : o.io_max) {  // "8:0 rbps=1M wbps=2M"
    auto parts = split(io, ' ');
    json l{{"device", parts[0]}};
    for (size_t i = 1; i < parts.size(); ++i) {
      auto eq = parts[i].find('=');
      if (eq == std::string::npos) die("--io-max " + io + ": expected 'MAJ:MIN key=value...'", 2);
      std::string k = parts[i].substr(0, eq), v = parts[i].substr(eq + 1);
      if (k == "riops" || k == "wiops")
        l[k] = std::strtoull(v.c_str(), nullptr, 10);
      else
        l[k] = v;
    }
    r["io_max"].push_back(l);
  }
  for (const auto& h : o.hugetlb) {
    auto eq = h.find('=');
    if (eq == std::string::npos) die("--hugetlb " + h + ": expected SIZE=LIMIT, e.g. 2M=64M", 2);
    r["hugetlb"][h.substr(0, eq)] = h.substr(eq + 1);
  }
  if (!o.cpuset_cpus.empty()) r["cpuset_cpus"] = o.cpuset_cpus;
  if (!o.cpuset_mems.empty()) r["cpuset_mems"] = o.cpuset_mems;
  if (o.best_effort) r["best_effort"] = true;
  if (o.net != "host" || !o.share.empty()) {
    json& ns = s["namespaces"];
    ns["network"] = o.net;
    for (const auto& sh : o.share) {
      if (sh != "pid" && sh != "mount" && sh != "uts" && sh != "ipc")
        die("--share " + sh + ": expected pid, mount, uts or ipc", 2);
      ns[sh] = false;
    }
  }
  json& rs = s["restart"];
  if (!rs.is_object()) rs = json::object();
  if (o.restart != "never" || !rs.contains("policy")) rs["policy"] = o.restart;
  if (!o.restart_delay.empty()) rs["delay"] = o.restart_delay;
  if (!o.restart_max_delay.empty()) rs["max_delay"] = o.restart_max_delay;
  if (!o.restart_reset.empty()) rs["reset_after"] = o.restart_reset;
  if (o.max_restarts != -2) rs["max_restarts"] = o.max_restarts;
  if (!o.stop_signal.empty()) s["stop_signal"] = o.stop_signal;
  if (!o.stop_grace.empty()) s["stop_grace"] = o.stop_grace;
  if (!o.log_max_size.empty()) s["logs"]["max_file_size"] = o.log_max_size;
  if (o.log_max_files) s["logs"]["max_files"] = o.log_max_files;
  return s;
}

void print_task_line(const json& t) {
  print_table(
      {{"ID", "NAME", "STATE", "PID", "EXIT", "SIGNAL", "OOM", "RESTARTS", "CGROUP"},
       {str_or(t, "id"), str_or(t, "name"), str_or(t, "state"), str_or(t, "pid"),
        str_or(t, "exit_code"), str_or(t, "signal"), t.value("oom_killed", false) ? "yes" : "no",
        str_or(t, "restarts"), str_or(t, "cgroup")}});
}

// Streams logs; with follow, keeps polling until the task has ended and everything is out.
// With --json, prints one JSON object per chunk: {"stream", "data", "cursor", ...}.
int logs_command(rpc::Client& c, const std::string& id, const std::string& stream, bool follow,
                 int64_t tail, bool as_json) {
  std::vector<std::string> streams = stream == "all" ? std::vector<std::string>{"stdout", "stderr"}
                                                     : std::vector<std::string>{stream};
  std::map<std::string, json> cursors;
  for (;;) {
    bool got = false, ended = false;
    for (const auto& s : streams) {
      json p{{"id", id}, {"stream", s}, {"max_bytes", 262144}};
      if (cursors.count(s))
        p["cursor"] = cursors[s];
      else if (tail >= 0)
        p["tail"] = tail;
      json r = call_or_die(c, "task.logs", p);
      std::string data = r.value("data", "");
      if (r.value("skipped", false))
        std::cerr << "weftctl: [some " << s << " output was rotated away]\n";
      if (!data.empty()) {
        got = true;
        if (as_json) {
          r["stream"] = s;
          std::cout << r.dump() << "\n";
        } else {
          std::fwrite(data.data(), 1, data.size(), s == "stderr" ? stderr : stdout);
        }
      }
      cursors[s] = r["cursor"];
      std::string st = r.value("state", "");
      ended = st == "exited" || st == "failed" || st == "stopped";
    }
    std::fflush(stdout);
    if (!follow) return 0;
    if (!got) {
      if (ended) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weftctl: control weft daemons"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags such as --json work after the subcommand too
  Globals g;
  if (const char* e = std::getenv("WEFT_AGENT")) g.agent = e;
  if (const char* e = std::getenv("WEFT_SIDEKICK")) g.sidekick = e;
  app.add_option("--agent", g.agent,
                 "weft-agent socket (default /run/weft/agent.sock, $WEFT_AGENT)");
  app.add_option("--sidekick", g.sidekick,
                 "weft-sidekick socket (default /run/weft/sidekick.sock, $WEFT_SIDEKICK)");
  if (const char* e = std::getenv("WEFT_HCS")) g.hcs = e;
  app.add_option("--hcs", g.hcs, "weft-hcs socket (default /run/weft/hcs.sock, $WEFT_HCS)");
  if (const char* e = std::getenv("WEFT_CONTROLPLANE")) g.controlplane = e;
  app.add_option("--controlplane", g.controlplane,
                 "weft-controlplane socket (default /run/weft/controlplane.sock, "
                 "$WEFT_CONTROLPLANE)");
  app.add_flag("--json", g.json_out, "print replies as JSON");
  ClusterCommands cluster;
  add_cluster_commands(app, cluster);

  auto* task = app.add_subcommand("task", "run and manage tasks on this machine's agent");
  task->require_subcommand(1);
  auto* agent_cmd = app.add_subcommand("agent", "the local agent");
  agent_cmd->require_subcommand(1);
  auto* agent_info = agent_cmd->add_subcommand("info", "machine id, labels, cgroup controllers");

  RunOptions ro;
  auto* run = task->add_subcommand("run", "start a task; prints its id");
  run->add_option("--name", ro.name, "task name (default: from the command)");
  run->add_option("--spec", ro.spec_file, "JSON task spec file (flags override it)");
  run->add_option("--cpu", ro.cpu, "CPU limit in cores, e.g. 0.5");
  run->add_option("--cpu-weight", ro.cpu_weight, "cpu.weight 1..10000");
  run->add_option("--memory", ro.memory, "memory.max, e.g. 256M");
  run->add_option("--memory-high", ro.memory_high, "memory.high");
  run->add_option("--swap", ro.swap, "memory.swap.max");
  run->add_option("--pids", ro.pids, "pids.max");
  run->add_option("--io-max", ro.io_max, "io.max line, e.g. '8:0 rbps=10M wiops=100' (repeatable)");
  run->add_option("--hugetlb", ro.hugetlb, "huge page limit SIZE=LIMIT, e.g. 2M=64M (repeatable)");
  run->add_option("--cpuset-cpus", ro.cpuset_cpus, "cpuset.cpus, e.g. 0-1");
  run->add_option("--cpuset-mems", ro.cpuset_mems, "cpuset.mems");
  run->add_flag("--best-effort", ro.best_effort,
                "skip limits whose controller is missing instead of failing");
  run->add_option("-e,--env", ro.env, "environment NAME=VALUE (repeatable)");
  run->add_option("--cwd", ro.cwd, "working directory");
  run->add_option("--user", ro.user, "user name or uid");
  run->add_option("--group", ro.group, "group name or gid");
  run->add_option("--rootfs", ro.rootfs, "root filesystem directory (pivot_root)");
  run->add_option("--hostname", ro.hostname, "hostname in the task's UTS namespace");
  run->add_option("--net", ro.net, "network: host or private")
      ->check(CLI::IsMember({"host", "private"}));
  run->add_option("--share", ro.share, "share a host namespace: pid, mount, uts, ipc (repeatable)");
  run->add_option("--restart", ro.restart, "never, on-failure or always")
      ->check(CLI::IsMember({"never", "on-failure", "always"}));
  run->add_option("--restart-delay", ro.restart_delay, "first restart delay, e.g. 1s");
  run->add_option("--restart-max-delay", ro.restart_max_delay, "backoff cap, e.g. 1m");
  run->add_option("--restart-reset", ro.restart_reset, "a run this long resets the backoff");
  run->add_option("--max-restarts", ro.max_restarts, "restart limit (-1 = unlimited)");
  run->add_option("--stop-signal", ro.stop_signal, "signal sent by stop (default SIGTERM)");
  run->add_option("--stop-grace", ro.stop_grace, "time between stop signal and kill (default 10s)");
  run->add_option("--log-max-size", ro.log_max_size,
                  "size of one log file before a new one starts");
  run->add_option("--log-max-files", ro.log_max_files, "log files kept per stream");
  run->add_option("command", ro.argv, "the command and its arguments (after --)");

  std::string id;
  auto* ls = task->add_subcommand("ls", "list tasks");
  bool ls_all = true;
  ls->add_flag("--running{false},-r{false}", ls_all, "only tasks that are not finished");
  bool ls_cluster = false;
  ls->add_flag("--cluster", ls_cluster, "every task of the cluster (weft-controlplane)");
  auto* show = task->add_subcommand("show", "show one task with stats");
  show->add_option("id", id, "task id or name")->required();
  std::string grace;
  auto* stop = task->add_subcommand("stop", "stop signal, grace period, then kill");
  stop->add_option("id", id, "task id or name")->required();
  stop->add_option("--grace", grace, "override the task's grace period, e.g. 2s");
  std::string sig = "SIGKILL";
  auto* kill = task->add_subcommand("kill", "send a signal (default SIGKILL: the whole cgroup)");
  kill->add_option("id", id, "task id or name")->required();
  kill->add_option("-s,--signal", sig, "signal name or number");
  auto* freeze = task->add_subcommand("freeze", "freeze every process of a task (cgroup.freeze)");
  freeze->add_option("id", id, "task id or name")->required();
  auto* thaw = task->add_subcommand("thaw", "thaw a frozen task");
  thaw->add_option("id", id, "task id or name")->required();
  auto* rm = task->add_subcommand("rm", "forget a finished task and delete its logs");
  rm->add_option("id", id, "task id or name")->required();
  bool follow = false;
  std::string stream = "all";
  int64_t tail = -1;
  auto* logs = task->add_subcommand("logs", "print a task's output");
  logs->add_option("id", id, "task id or name")->required();
  logs->add_flag("-f,--follow", follow, "keep printing new output until the task ends");
  logs->add_option("--stream", stream, "stdout, stderr or all")
      ->check(CLI::IsMember({"stdout", "stderr", "all"}));
  logs->add_option("--tail", tail, "start this many lines before the end");

  auto* health =
      app.add_subcommand("health", "machine health (weft-hcs): verdict and failing probes");
  auto* h_probes = health->add_subcommand("probes", "every probe with its state and figures");
  std::vector<std::string> h_names;
  h_probes->add_option("names", h_names, "only these probes (e.g. oom link:eth0)");
  int h_limit = 50;
  auto* h_history = health->add_subcommand("history", "probe state changes");
  h_history->add_option("-n,--limit", h_limit, "how many");

  auto* profile = app.add_subcommand("profile", "host profiles (weft-sidekick)");
  profile->require_subcommand(1);
  std::string pname;
  int history_limit = 20;
  auto* p_ls = profile->add_subcommand("ls", "list profiles");
  auto* p_show = profile->add_subcommand("show", "a profile's compiled knobs");
  p_show->add_option("name", pname, "profile")->required();
  auto* p_active =
      profile->add_subcommand("active", "the active profile and its last verification");
  auto* p_plan = profile->add_subcommand("plan", "what switching to a profile would change");
  p_plan->add_option("name", pname, "profile")->required();
  bool no_wait = false;
  auto* p_switch =
      profile->add_subcommand("switch", "switch to a profile (only changed knobs are written)");
  p_switch->add_option("name", pname, "profile")->required();
  p_switch->add_flag("--no-wait", no_wait, "do not follow huge pages converging in the background");
  auto* p_verify = profile->add_subcommand("verify", "compare the machine with the active profile");
  auto* p_off = profile->add_subcommand("off", "restore every setting weft changed");
  std::string tuned_path;
  auto* p_import = profile->add_subcommand("import-tuned",
                                           "convert a TuneD profile (tuned.conf) to weft's format");
  p_import->add_option("path", tuned_path, "TuneD profile directory or tuned.conf")->required();
  auto* p_history = profile->add_subcommand("history", "past switches");
  p_history->add_option("-n,--limit", history_limit, "how many");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (int rc = run_cluster_commands(cluster, g); rc >= 0) return rc;
  if (ls->parsed() && ls_cluster) return cluster_task_ls(g);

  if (health->parsed()) {
    auto hc = connect_or_die(g.hcs, "weft-hcs", "--hcs");
    if (h_probes->parsed()) {
      json r = call_or_die(*hc, "health.probes", json::object());
      if (!h_names.empty()) {
        json keep = json::array();
        for (const auto& p : r["probes"])
          if (std::find(h_names.begin(), h_names.end(), str_or(p, "probe")) != h_names.end())
            keep.push_back(p);
        if (keep.size() != h_names.size()) {
          std::cerr << "weftctl: no such probe; `weftctl health probes` lists them\n";
          return 1;
        }
        r["probes"] = keep;
      }
      if (g.json_out)
        std::cout << r.dump(2) << "\n";
      else {
        std::vector<std::vector<std::string>> rows = {
            {"PROBE", "STATE", "SINCE", "SOURCE", "DETAIL"}};
        for (const auto& p : r["probes"]) {
          std::string source = "-";
          if (p.contains("metrics") && p["metrics"].is_object())
            source = str_or(p["metrics"], "source", "-");
          rows.push_back({str_or(p, "probe"),
                          str_or(p, "state") + (p.value("pinned", false) ? " (flapping)" : ""),
                          str_or(p, "since"), source, str_or(p, "detail")});
        }
        print_table(rows);
      }
      return 0;
    }
    if (h_history->parsed()) {
      json r = call_or_die(*hc, "health.history", {{"limit", h_limit}});
      if (g.json_out)
        std::cout << r.dump(2) << "\n";
      else {
        std::vector<std::vector<std::string>> rows = {{"AT", "PROBE", "FROM", "TO", "DETAIL"}};
        for (const auto& t : r["transitions"])
          rows.push_back({str_or(t, "at"), str_or(t, "probe"), str_or(t, "from"), str_or(t, "to"),
                          str_or(t, "detail")});
        print_table(rows);
      }
      return 0;
    }
    json r = call_or_die(*hc, "health.verdict", json::object());
    if (g.json_out)
      std::cout << r.dump(2) << "\n";
    else {
      std::cout << "machine: " << str_or(r, "verdict")
                << (r.value("published", false) ? "" : " (first cycle not done)") << "\n";
      for (const auto& p : r["problems"])
        std::cout << "  " << str_or(p, "probe") << ": " << str_or(p, "state") << " since "
                  << str_or(p, "since") << " — " << str_or(p, "detail") << "\n";
    }
    std::string v = r.value("verdict", "unknown");
    return v == "ok" ? 0 : v == "degraded" ? 3 : 1;
  }

  if (profile->parsed()) {
    auto sk = connect_or_die(g.sidekick, "weft-sidekick", "--sidekick");
    auto out_json = [&](const json& j, const std::function<void()>& human) {
      if (g.json_out)
        std::cout << j.dump(2) << "\n";
      else
        human();
    };
    if (p_ls->parsed()) {
      json r = call_or_die(*sk, "profile.ls", json::object());
      out_json(r, [&] {
        std::vector<std::vector<std::string>> rows = {{"NAME", "ACTIVE", "DESCRIPTION"}};
        for (const auto& p : r["profiles"])
          rows.push_back({str_or(p, "name"), p.value("active", false) ? "*" : "",
                          p.value("valid", true) ? str_or(p, "description")
                                                 : "INVALID: " + str_or(p, "error")});
        print_table(rows);
      });
    } else if (p_show->parsed()) {
      json r = call_or_die(*sk, "profile.show", {{"name", pname}});
      out_json(r, [&] {
        std::cout << r["name"].get<std::string>() << ": " << str_or(r, "description") << "\n";
        std::vector<std::vector<std::string>> rows = {
            {"KNOB", "VALUE", "CMP", "CLASS", "REQUIRED", "SOURCE"}};
        for (const auto& k : r["knobs"])
          rows.push_back({str_or(k, "id"), str_or(k, "value"), str_or(k, "cmp"), str_or(k, "class"),
                          k.value("required", true) ? "yes" : "no", str_or(k, "source")});
        print_table(rows);
      });
    } else if (p_active->parsed()) {
      json r = call_or_die(*sk, "profile.active", json::object());
      out_json(r, [&] {
        std::cout << str_or(r, "profile", "none") << " (" << str_or(r, "state") << ")\n";
      });
    } else if (p_plan->parsed()) {
      json r = call_or_die(*sk, "profile.plan", {{"name", pname}});
      out_json(r, [&] {
        for (const auto& c : r.value("conflicts", json::array()))
          std::cerr << "conflict: " << c["knob"].get<std::string>() << " also set by "
                    << c["owner"].get<std::string>() << " (" << c["detail"].get<std::string>()
                    << ")\n";
        std::vector<std::vector<std::string>> rows = {{"KNOB", "FROM", "TO", "CLASS", "SOURCE"}};
        for (const auto& c : r["changes"])
          rows.push_back({str_or(c, "id"), str_or(c, "from"), str_or(c, "to"), str_or(c, "class"),
                          str_or(c, "source")});
        print_table(rows);
        std::cout << r["changes"].size() << " to change, " << r.value("unchanged", 0)
                  << " already right\n";
        for (const auto& a : r.value("reboot_pending", json::array()))
          std::cout << "needs a reboot: kernel argument " << a.get<std::string>() << "\n";
      });
    } else if (p_switch->parsed()) {
      json r = call_or_die(*sk, "profile.switch", {{"name", pname}});
      int rc = report_profile(r, g.json_out);
      bool converging = false;
      for (const auto& k : r.value("knobs", json::array()))
        converging |= k.value("status", "") == "converging";
      if (!converging || no_wait) return rc;
      // Slow knobs (huge pages) converge in the background: show their progress.
      for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        json a = call_or_die(*sk, "profile.active", json::object());
        bool pending = false, failed = false;
        std::string line;
        for (const auto& k : a.value("convergence", json::array())) {
          line += "  " + str_or(k, "id") + " " + str_or(k, "progress") + " " + str_or(k, "state");
          pending |= k.value("state", "") == "converging";
          failed |= k.value("state", "") == "failed";
        }
        if (g.json_out)
          std::cout << a["convergence"].dump() << "\n";
        else
          std::cout << "converging:" << line << "\n";
        std::cout.flush();
        if (!pending) return failed ? 1 : rc;
      }
    } else if (p_verify->parsed()) {
      return report_profile(call_or_die(*sk, "profile.verify", json::object()), g.json_out);
    } else if (p_off->parsed()) {
      return report_profile(call_or_die(*sk, "profile.off", json::object()), g.json_out);
    } else if (p_import->parsed()) {
      std::string file = tuned_path;
      if (path_exists(file + "/tuned.conf")) file += "/tuned.conf";
      auto text = read_file_bounded(file, kMaxTomlBytes);
      if (!text.ok()) die(text.error().str(), 1);
      std::string name = tuned_path;
      while (name.size() > 1 && name.back() == '/') name.pop_back();
      if (name.size() > 11 && name.compare(name.size() - 11, 11, "/tuned.conf") == 0)
        name.resize(name.size() - 11);
      name = name.substr(name.rfind('/') + 1);
      json r = call_or_die(*sk, "profile.import_tuned", {{"text", *text}, {"name", name}});
      if (g.json_out) {
        std::cout << r.dump(2) << "\n";
      } else {
        std::cout << r["toml"].get<std::string>();
        for (const auto& u : r["unconverted"])
          std::cerr << "not converted: " << u.get<std::string>() << "\n";
      }
      return r["unconverted"].empty() ? 0 : 3;
    } else if (p_history->parsed()) {
      json r = call_or_die(*sk, "profile.history", {{"limit", history_limit}});
      out_json(r, [&] {
        std::vector<std::vector<std::string>> rows = {
            {"ID", "FROM", "TO", "STATE", "STARTED", "DETAIL"}};
        for (const auto& h : r["switches"])
          rows.push_back({str_or(h, "id"), str_or(h, "from"), str_or(h, "to"), str_or(h, "state"),
                          str_or(h, "started_at"), str_or(h, "detail")});
        print_table(rows);
      });
    }
    return 0;
  }

  auto client = connect_or_die(g.agent, "weft-agent", "--agent");
  auto out = [&](const json& j, const std::function<void()>& human) {
    if (g.json_out)
      std::cout << j.dump(2) << "\n";
    else
      human();
  };

  if (agent_info->parsed()) {
    json r = call_or_die(*client, "agent.info", json::object());
    out(r, [&] { print_kv(r); });
  } else if (run->parsed()) {
    if (ro.argv.empty() && ro.spec_file.empty())
      die("task run needs a command: weftctl task run [options] -- CMD ARGS", 2);
    json r = call_or_die(*client, "task.run", build_spec(ro));
    out(r, [&] {
      std::cout << r["id"].get<std::string>() << "\n";
      for (const auto& w : r.value("warnings", json::array()))
        std::cerr << "weftctl: warning: " << w.get<std::string>() << "\n";
    });
  } else if (ls->parsed()) {
    json r = call_or_die(*client, "task.ls", json::object());
    json tasks = json::array();
    for (const auto& t : r["tasks"]) {
      std::string st = t.value("state", "");
      if (!ls_all && (st == "exited" || st == "failed" || st == "stopped")) continue;
      tasks.push_back(t);
    }
    out(tasks, [&] {
      std::vector<std::vector<std::string>> rows = {
          {"ID", "NAME", "STATE", "PID", "EXIT", "SIGNAL", "OOM", "RESTARTS", "CGROUP"}};
      for (const auto& t : tasks)
        rows.push_back({str_or(t, "id"), str_or(t, "name"), str_or(t, "state"), str_or(t, "pid"),
                        str_or(t, "exit_code"), str_or(t, "signal"),
                        t.value("oom_killed", false) ? "yes" : "no", str_or(t, "restarts"),
                        str_or(t, "cgroup")});
      print_table(rows);
    });
  } else if (show->parsed()) {
    json r = call_or_die(*client, "task.show", {{"id", id}});
    out(r, [&] { print_kv(r); });
  } else if (stop->parsed()) {
    json p{{"id", id}};
    if (!grace.empty()) p["grace"] = grace;
    json r = call_or_die(*client, "task.stop", p);
    out(r, [&] { print_task_line(r); });
  } else if (kill->parsed()) {
    json r = call_or_die(*client, "task.kill", {{"id", id}, {"signal", sig}});
    out(r, [&] { print_task_line(r); });
  } else if (freeze->parsed() || thaw->parsed()) {
    json r = call_or_die(*client, freeze->parsed() ? "task.freeze" : "task.thaw", {{"id", id}});
    out(r, [&] {
      std::cout << r["id"].get<std::string>() << (r.value("frozen", false) ? " frozen" : " thawed")
                << "\n";
    });
  } else if (rm->parsed()) {
    json r = call_or_die(*client, "task.remove", {{"id", id}});
    out(r, [&] { std::cout << r["id"].get<std::string>() << " removed\n"; });
  } else if (logs->parsed()) {
    return logs_command(*client, id, stream, follow, tail, g.json_out);
  }
  return 0;
}
