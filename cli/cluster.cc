#include "cli/cluster.h"

#include <chrono>
#include <thread>

namespace weft::cli {

ClusterNouns add_cluster_commands(CLI::App& app, Handlers& h) {
  ClusterNouns n;
  n.machine = add_machine_commands(app, h);
  n.entitlement = add_entitlement_commands(app, h);
  n.job = add_job_commands(app, h);
  add_service_commands(app, h);
  add_maintenance_commands(app, h);
  add_web_commands(app, h);
  add_audit_commands(app, h);
  add_controlplane_commands(app, h);
  add_region_commands(app, n, h);
  add_autoscale_commands(n.job, h);
  add_job_events_commands(n.job, h);
  add_job_rollout_commands(n.job, h);
  add_rebalance_commands(app, h);
  add_top_commands(app, h);
  return n;
}

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

void warn_partial(const json& r, const char* what) {
  if (r.contains("unreachable") && r["unreachable"].is_array())
    for (const auto& u : r["unreachable"])
      std::cerr << "weftctl: shard " << str_or(u, "shard") << " did not answer, its " << what
                << " are not listed: " << str_or(u, "error") << "\n";
  if (r.value("truncated", false))
    std::cerr << "weftctl: the list of " << what << " is cut short (a shard has more)\n";
}

TaskState state_of(const json& task) {
  return parse_task_state(task.value("state", "")).value_or(TaskState::kLost);
}

void add_follow_options(CLI::App* cmd, FollowOptions& f) {
  cmd->add_flag("--detach", f.detach, "return at once instead of following the progress");
  cmd->add_option("--timeout", f.timeout_s, "seconds to follow the progress (default 300)");
}

int follow(const std::function<Progress()>& poll, int timeout_s, bool json_out,
           const std::string& then) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
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
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "weftctl: gave up waiting after " << timeout_s
                << "s; the control plane carries on (" << then << ")\n";
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
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

}  // namespace weft::cli
