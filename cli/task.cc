#include "cli/task.h"

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "cli/cluster.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/strings.h"
#include "common/task_spec.h"
#include "common/task_state.h"
#include "common/units.h"

namespace weft::cli {

namespace {

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
  if (!o.image.empty()) s["image"] = o.image;
  if (!o.package.empty()) {
    if (o.package_sha256.empty()) die("--package needs --package-sha256", 2);
    s["package"] = {{"url", o.package}, {"sha256", o.package_sha256}};
    if (!o.package_target.empty()) s["package"]["target"] = o.package_target;
  } else if (!o.package_sha256.empty() || !o.package_target.empty()) {
    die("--package-sha256 and --package-target go with --package", 2);
  }
  if (!s.contains("name") && s.contains("image") && s["image"].is_string()) {
    std::string repo = s["image"].get<std::string>();
    repo = repo.substr(0, repo.find_first_of(":@", repo.find('/')));
    repo = repo.substr(repo.rfind('/') + 1);
    std::string clean;
    for (char ch : repo)
      clean += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_') ? ch : '-';
    s["name"] = (clean.empty() ? "task" : clean) + "-" + random_hex(3);
  }
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

}  // namespace

int stream_logs(rpc::Client& c, const json& first_target, const LogOptions& o) {
  // A job's index names its live task; once a reply names the task, that one is followed
  // (a replacement has other output, and cursors of its own).
  json target = first_target;
  std::vector<std::string> streams = o.stream == "all"
                                         ? std::vector<std::string>{"stdout", "stderr"}
                                         : std::vector<std::string>{o.stream};
  // The control plane waits for output itself (a long poll): for one stream up to 25 s a
  // call, for both 1 s each, so neither waits long behind the other.
  uint64_t wait_ms = o.long_poll && o.follow ? (streams.size() == 1 ? 25000 : 1000) : 0;
  std::map<std::string, json> cursors;
  for (;;) {
    bool got = false, ended = false;
    for (const auto& s : streams) {
      json p = target;
      p["stream"] = s;
      p["max_bytes"] = 262144;
      if (cursors.count(s))
        p["cursor"] = cursors[s];
      else if (o.tail >= 0)
        p["tail"] = o.tail;
      if (wait_ms && cursors.count(s)) p["wait_ms"] = wait_ms;
      json r = call_or_die(c, "task.logs", p, static_cast<int>(wait_ms) + 30000);
      std::string data = r.value("data", "");
      if (r.value("skipped", false))
        std::cerr << "weftctl: [some " << s << " output was rotated away]\n";
      if (!data.empty()) {
        got = true;
        if (o.as_json) {
          r["stream"] = s;
          std::cout << r.dump() << "\n";
        } else {
          FILE* out = s == "stderr" ? stderr : stdout;
          if (!o.raw && ::isatty(::fileno(out))) data = escape_terminal(data);
          std::fwrite(data.data(), 1, data.size(), out);
        }
      }
      cursors[s] = r["cursor"];
      if (target.contains("job") && r.contains("task") && r["task"].is_string())
        target = {{"task", r["task"]}};
      auto st = parse_task_state(r.value("state", ""));
      ended = st && task_ended(*st);
    }
    std::fflush(stdout);
    if (!o.follow) return 0;
    if (!got) {
      if (ended) return 0;
      if (!wait_ms) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

namespace {

struct TaskOptions {
  RunOptions ro;
  std::string id, grace, sig = "SIGKILL", stream = "all", image_ref;
  bool ls_all = true, ls_cluster = false, follow = false, logs_cluster = false, raw = false;
  bool show_cluster = false, kill_cluster = false;
  bool run_wait = false, run_rm = false;  // task run --wait [--rm]
  int64_t tail = -1;
};

std::unique_ptr<rpc::Client> agent_client(const Globals& g) {
  return connect_or_die(g.agent, "weft-agent", "--agent");
}

// task run --wait: task.wait until the task ended (each call a long poll of a minute;
// with --rm the agent forgets it as it answers), then its status as weftctl's: the exit code,
// 128+signal, 125 when it never ran.
int wait_for_task(rpc::Client& client, const json& started, bool rm, const Globals& g) {
  std::string id = started["id"].get<std::string>();
  for (const auto& w : started.value("warnings", json::array()))
    std::cerr << "weftctl: warning: " << w.get<std::string>() << "\n";
  json t;
  do {
    t = call_or_die(client, "task.wait", {{"id", id}, {"wait_ms", 60000}, {"remove", rm}}, 70000);
  } while (!t.value("ended", false));
  print_json_or(g, t, [&] {
    if (t.value("state", "") != "exited")
      std::cerr << "weftctl: task " << id << " " << str_or(t, "state") << ": "
                << str_or(t, "reason") << "\n";
  });
  if (t.contains("signal") && t["signal"].is_string())
    if (auto sig = parse_signal(t["signal"].get<std::string>()); sig.ok()) return 128 + *sig;
  if (t.contains("exit_code") && t["exit_code"].is_number_integer())
    return t["exit_code"].get<int>();
  return 125;
}

int task_run(const Globals& g, const TaskOptions& o) {
  auto client = agent_client(g);
  if (o.ro.argv.empty() && o.ro.spec_file.empty() && o.ro.image.empty())
    die("task run needs a command or an image: weftctl task run [options] -- CMD ARGS", 2);
  json r = call_or_die(*client, "task.run", build_spec(o.ro));
  if (o.run_wait) return wait_for_task(*client, r, o.run_rm, g);
  print_json_or(g, r, [&] {
    std::cout << r["id"].get<std::string>() << "\n";
    for (const auto& w : r.value("warnings", json::array()))
      std::cerr << "weftctl: warning: " << w.get<std::string>() << "\n";
  });
  return 0;
}

int task_ls(const Globals& g, const TaskOptions& o) {
  json r = call_or_die(*agent_client(g), "task.ls", json::object());
  json tasks = json::array();
  for (const auto& t : r["tasks"]) {
    auto st = parse_task_state(t.value("state", ""));
    if (!o.ls_all && st && task_ended(*st)) continue;
    tasks.push_back(t);
  }
  print_json_or(g, tasks, [&] {
    std::vector<std::vector<std::string>> rows = {
        {"ID", "NAME", "STATE", "PID", "EXIT", "SIGNAL", "OOM", "RESTARTS", "CGROUP"}};
    for (const auto& t : tasks)
      rows.push_back({str_or(t, "id"), str_or(t, "name"), str_or(t, "state"), str_or(t, "pid"),
                      str_or(t, "exit_code"), str_or(t, "signal"),
                      t.value("oom_killed", false) ? "yes" : "no", str_or(t, "restarts"),
                      str_or(t, "cgroup")});
    print_table(rows);
  });
  return 0;
}

int task_logs(const Globals& g, const TaskOptions& t) {
  // The local agent's task if it has one by that id or name; else the control plane's.
  LogOptions o{t.stream, t.follow, t.tail, g.json_out, false, t.raw};
  if (!t.logs_cluster) {
    auto local = rpc::Client::connect(g.agent);
    if (local.ok()) {
      auto has = (*local)->call("task.show", {{"id", t.id}}, 10000);
      if (has.ok()) return stream_logs(**local, {{"id", t.id}}, o);
      if (has.error().code != rpc::kNotFound) die(has.error().str());
      // Not here, and no control plane to ask: the agent's answer is the one to give.
      if (g.controlplane.rfind("tls://", 0) != 0 && g.controlplane.find(',') == std::string::npos &&
          !path_exists(g.controlplane))
        die(has.error().str());
    }
  }
  return cluster_logs(g, {{"task", t.id}}, o);
}

int image_ls_command(const Globals& g) {
  json r = call_or_die(*agent_client(g), "image.ls", json::object());
  print_json_or(g, r, [&] {
    std::vector<std::vector<std::string>> rows = {
        {"KIND", "REFERENCE", "DIGEST", "LAYERS", "SIZE", "LAST USED", "USED BY"}};
    for (const auto& img : r["images"]) {
      std::string refs, users;
      for (const auto& x : img["refs"]) refs += (refs.empty() ? "" : ",") + x.get<std::string>();
      for (const auto& x : img["used_by"])
        users += (users.empty() ? "" : ",") + x.get<std::string>();
      std::string d = img.value("digest", "");
      rows.push_back({img.value("kind", "image"), refs.empty() ? "-" : refs, d.substr(0, 19),
                      str_or(img, "layers"), format_size(img.value("size", uint64_t{0})),
                      str_or(img, "last_used"), users.empty() ? "-" : users});
    }
    print_table(rows);
    std::cout << "cache: " << format_size(r.value("size", uint64_t{0})) << " of "
              << format_size(r.value("limit", uint64_t{0})) << "\n";
    if (r.contains("refused") && r["refused"].is_array())
      for (const auto& x : r["refused"])
        std::cout << "refused layer " << x.value("layer", "").substr(0, 19) << " until "
                  << x.value("until", "") << ": " << x.value("reason", "") << "\n";
  });
  return 0;
}

// `task run`: the spec from its options (and --spec), beside its handler.
void add_task_run(CLI::App& task, Handlers& h, const std::shared_ptr<TaskOptions>& o) {
  CLI::App* run = task.add_subcommand("run", "start a task; prints its id");
  run->add_option("--name", o->ro.name, "task name (default: from the command)");
  run->add_option("--spec", o->ro.spec_file, "JSON task spec file (flags override it)");
  run->add_option("--cpu", o->ro.cpu, "CPU limit in cores, e.g. 0.5");
  run->add_option("--cpu-weight", o->ro.cpu_weight, "cpu.weight 1..10000");
  run->add_option("--memory", o->ro.memory, "memory.max, e.g. 256M");
  run->add_option("--memory-high", o->ro.memory_high, "memory.high");
  run->add_option("--swap", o->ro.swap, "memory.swap.max");
  run->add_option("--pids", o->ro.pids, "pids.max");
  run->add_option("--io-max", o->ro.io_max,
                  "io.max line, e.g. '8:0 rbps=10M wiops=100' (repeatable)");
  run->add_option("--hugetlb", o->ro.hugetlb,
                  "huge page limit SIZE=LIMIT, e.g. 2M=64M (repeatable)");
  run->add_option("--cpuset-cpus", o->ro.cpuset_cpus, "cpuset.cpus, e.g. 0-1");
  run->add_option("--cpuset-mems", o->ro.cpuset_mems, "cpuset.mems");
  run->add_flag("--best-effort", o->ro.best_effort,
                "skip limits whose controller is missing instead of failing");
  run->add_option("-e,--env", o->ro.env, "environment NAME=VALUE (repeatable)");
  run->add_option("--cwd", o->ro.cwd, "working directory");
  run->add_option("--user", o->ro.user, "user name or uid");
  run->add_option("--group", o->ro.group, "group name or gid");
  run->add_option("--rootfs", o->ro.rootfs, "root filesystem directory (pivot_root)");
  run->add_option("--image", o->ro.image,
                  "OCI image <registry>/<repo>[:tag][@digest]: the task's root, and its "
                  "entrypoint, cmd, env, workdir and user as defaults");
  run->add_option("--package", o->ro.package,
                  "http(s) URL of a tarball the task runs (a .tar, .tar.gz or .tar.zst)");
  run->add_option("--package-sha256", o->ro.package_sha256,
                  "the tarball's SHA-256 (it is used only if its bytes match)");
  run->add_option("--package-target", o->ro.package_target,
                  "where the package appears: \"/\" (default) makes it the task's root; "
                  "with --image or --rootfs, a directory, mounted read-only");
  run->add_option("--hostname", o->ro.hostname, "hostname in the task's UTS namespace");
  run->add_option("--net", o->ro.net,
                  "network: host (the default here), private (only lo), bridge (an address "
                  "on the machine's bridge) or own (bridge where there is one, else private)")
      ->check(CLI::IsMember({"host", "private", "bridge", "own"}));
  run->add_option("--share", o->ro.share,
                  "share a host namespace: pid, mount, uts, ipc (repeatable)");
  run->add_option("--restart", o->ro.restart, "never, on-failure or always")
      ->check(CLI::IsMember({"never", "on-failure", "always"}));
  run->add_option("--restart-delay", o->ro.restart_delay, "first restart delay, e.g. 1s");
  run->add_option("--restart-max-delay", o->ro.restart_max_delay, "backoff cap, e.g. 1m");
  run->add_option("--restart-reset", o->ro.restart_reset, "a run this long resets the backoff");
  run->add_option("--max-restarts", o->ro.max_restarts, "restart limit (-1 = unlimited)");
  run->add_option("--stop-signal", o->ro.stop_signal, "signal sent by stop (default SIGTERM)");
  run->add_option("--stop-grace", o->ro.stop_grace,
                  "time between stop signal and kill (default 10s)");
  run->add_option("--log-max-size", o->ro.log_max_size,
                  "size of one log file before a new one starts");
  run->add_option("--log-max-files", o->ro.log_max_files, "log files kept per stream");
  run->add_flag("--wait", o->run_wait,
                "wait until the task ends; weftctl exits with its status: its exit code "
                "(127: its program could not be run), 128+signal, or 125 when the task "
                "could not start");
  run->add_flag("--rm", o->run_rm, "with --wait: forget the task and its logs once it ended")
      ->needs("--wait");
  run->add_option("command", o->ro.argv, "the command and its arguments (after --)");

  h.on(run, [o](const Globals& g) { return task_run(g, *o); });
}

// `image ls/pull/rm/prune`: the machine's image cache.
void add_image_commands(CLI::App& app, Handlers& h, const std::shared_ptr<TaskOptions>& o) {
  CLI::App* image = app.add_subcommand("image", "the machine's image cache (weft-agent)");
  image->require_subcommand(1);
  CLI::App* image_ls = image->add_subcommand("ls", "list cached images, their size and users");
  CLI::App* image_pull = image->add_subcommand("pull", "fetch an image into the cache now");
  image_pull->add_option("image", o->image_ref, "<registry>/<repo>[:tag][@digest]")->required();
  CLI::App* image_rm = image->add_subcommand("rm", "remove an image no task uses");
  image_rm->add_option("image", o->image_ref, "reference or manifest digest")->required();
  CLI::App* image_prune = image->add_subcommand("prune", "remove every image no task uses");
  h.on(image_ls, image_ls_command);
  h.on(image_pull, [o](const Globals& g) {
    // A large image on a slow link takes minutes: wait up to an hour.
    auto pulled =
        agent_client(g)->call("image.pull", {{"image", o->image_ref}, {"wait", true}}, 3'600'000);
    if (!pulled.ok()) die(pulled.error().str());
    json r = std::move(pulled).value();
    print_json_or(g, r, [&] { std::cout << r.value("manifest", "") << "\n"; });
    return 0;
  });
  h.on(image_rm, [o](const Globals& g) {
    json r = call_or_die(*agent_client(g), "image.rm", {{"image", o->image_ref}});
    print_json_or(g, r, [&] {
      std::cout << "removed " << r.value("removed", "") << " ("
                << format_size(r.value("freed", uint64_t{0})) << " freed)\n";
    });
    return 0;
  });
  h.on(image_prune, [](const Globals& g) {
    json r = call_or_die(*agent_client(g), "image.prune", json::object());
    print_json_or(g, r, [&] {
      std::cout << "removed " << r["removed"].size() << " image(s), "
                << format_size(r.value("freed", uint64_t{0})) << " freed\n";
    });
    return 0;
  });
}

}  // namespace

CLI::App* add_task_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<TaskOptions>();
  CLI::App* task = app.add_subcommand("task", "run and manage tasks on this machine's agent");
  task->require_subcommand(1);
  CLI::App* agent = app.add_subcommand("agent", "the local agent");
  agent->require_subcommand(1);
  CLI::App* agent_info = agent->add_subcommand("info", "machine id, labels, cgroup controllers");
  add_task_run(*task, h, o);

  CLI::App* ls = task->add_subcommand("ls", "list tasks");
  ls->add_flag("--running{false},-r{false}", o->ls_all, "only tasks that are not finished");
  ls->add_flag("--cluster", o->ls_cluster, "every task of the cluster (weft-controlplane)");
  CLI::App* show = task->add_subcommand("show", "show one task with stats");
  show->add_option("id", o->id, "task id or name")->required();
  show->add_flag("--cluster", o->show_cluster,
                 "ask the control plane, wherever the task runs (its record, and its agent's "
                 "detail)");
  CLI::App* stop = task->add_subcommand("stop", "stop signal, grace period, then kill");
  stop->add_option("id", o->id, "task id or name")->required();
  stop->add_option("--grace", o->grace, "override the task's grace period, e.g. 2s");
  CLI::App* kill =
      task->add_subcommand("kill", "send a signal (default SIGKILL: the whole cgroup)");
  kill->add_option("id", o->id, "task id or name")->required();
  kill->add_option("-s,--signal", o->sig, "signal name or number");
  kill->add_flag("--cluster", o->kill_cluster,
                 "through the control plane, wherever the task runs (it is replaced as a "
                 "failed task is)");
  CLI::App* freeze =
      task->add_subcommand("freeze", "freeze every process of a task (cgroup.freeze)");
  freeze->add_option("id", o->id, "task id or name")->required();
  CLI::App* thaw = task->add_subcommand("thaw", "thaw a frozen task");
  thaw->add_option("id", o->id, "task id or name")->required();
  CLI::App* rm = task->add_subcommand("rm", "forget a finished task and delete its logs");
  rm->add_option("id", o->id, "task id or name")->required();
  CLI::App* logs = task->add_subcommand(
      "logs",
      "print a task's output: from this machine's agent, else (or with --cluster) "
      "through the control plane from the task's machine");
  logs->add_option("id", o->id, "task id or name (a control-plane task's id: job.index.N)")
      ->required();
  logs->add_flag("--cluster", o->logs_cluster, "ask the control plane, wherever the task runs");
  logs->add_flag("-f,--follow", o->follow, "keep printing new output until the task ends");
  logs->add_option("--stream", o->stream, "stdout, stderr or all")
      ->check(CLI::IsMember({"stdout", "stderr", "all"}));
  logs->add_option("--tail", o->tail, "start this many lines before the end");
  logs->add_flag("--raw", o->raw,
                 "write the output's bytes as they are, also to a terminal (control "
                 "characters are otherwise shown as \\xNN)");

  h.on(agent_info, [](const Globals& g) {
    json r = call_or_die(*agent_client(g), "agent.info", json::object());
    print_json_or(g, r, [&] { print_kv(r); });
    return 0;
  });
  h.on(ls, [o](const Globals& g) { return o->ls_cluster ? cluster_task_ls(g) : task_ls(g, *o); });
  h.on(show, [o](const Globals& g) {
    if (o->show_cluster) return cluster_task_show(g, o->id);
    json r = call_or_die(*agent_client(g), "task.show", {{"id", o->id}});
    print_json_or(g, r, [&] { print_kv(r); });
    return 0;
  });
  h.on(stop, [o](const Globals& g) {
    json p{{"id", o->id}};
    if (!o->grace.empty()) p["grace"] = o->grace;
    json r = call_or_die(*agent_client(g), "task.stop", p);
    print_json_or(g, r, [&] { print_task_line(r); });
    return 0;
  });
  h.on(kill, [o](const Globals& g) {
    if (o->kill_cluster) return cluster_task_signal(g, o->id, o->sig.empty() ? "SIGKILL" : o->sig);
    json r = call_or_die(*agent_client(g), "task.kill", {{"id", o->id}, {"signal", o->sig}});
    print_json_or(g, r, [&] { print_task_line(r); });
    return 0;
  });
  for (bool frozen : {true, false})
    h.on(frozen ? freeze : thaw, [o, frozen](const Globals& g) {
      json r = call_or_die(*agent_client(g), frozen ? "task.freeze" : "task.thaw", {{"id", o->id}});
      print_json_or(g, r, [&] {
        std::cout << r["id"].get<std::string>()
                  << (r.value("frozen", false) ? " frozen" : " thawed") << "\n";
      });
      return 0;
    });
  h.on(rm, [o](const Globals& g) {
    json r = call_or_die(*agent_client(g), "task.remove", {{"id", o->id}});
    print_json_or(g, r, [&] { std::cout << r["id"].get<std::string>() << " removed\n"; });
    return 0;
  });
  h.on(logs, [o](const Globals& g) { return task_logs(g, *o); });
  add_image_commands(app, h, o);

  return task;
}

}  // namespace weft::cli
