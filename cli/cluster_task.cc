// weftctl's operations on one task of the cluster, through the control plane
// (docs/operations.md, "One task"): `task restart ID`, `task signal ID SIGNAL`, and what
// `task show --cluster` and `task kill --cluster` call (their flags are in cli/task.cc).
#include <cstdio>
#include <iostream>

#include "cli/cluster.h"
#include "cli/task.h"

namespace weft::cli {

int cluster_task_show(const Globals& g, const std::string& id) {
  json r = call_or_die(*cp_client(g), "task.show", {{"id", id}}, 15000);
  print_json_or(g, r, [&] {
    std::printf("task %s: %s on %s (job %s, generation %s)%s\n", str_or(r, "id").c_str(),
                str_or(r, "state").c_str(), str_or(r, "machine").c_str(), str_or(r, "job").c_str(),
                str_or(r, "generation").c_str(), r.value("ready", false) ? ", ready" : "");
    if (r.contains("agent")) {
      std::cout << "\nits agent says:\n" << r["agent"].dump(2) << "\n";
    } else {
      std::printf("its agent: %s\n", str_or(r, "agent_error").c_str());
    }
  });
  return 0;
}

int cluster_task_signal(const Globals& g, const std::string& id, const std::string& signal) {
  json r = call_or_die(*cp_client(g), "task.signal", {{"id", id}, {"signal", signal}});
  print_json_or(g, r, [&] { std::printf("task %s: %s sent\n", id.c_str(), signal.c_str()); });
  return 0;
}

namespace {

struct ClusterTaskOptions {
  std::string id, sig;
};

int task_restart(const Globals& g, const std::string& id) {
  json r = call_or_die(*cp_client(g), "task.restart", {{"id", id}});
  print_json_or(g, r, [&] {
    if (r.value("waiting_for_controller", false))
      std::printf("task %s: restart asked of job %s's TaskController\n", id.c_str(),
                  str_or(r, "job").c_str());
    else
      std::printf("task %s: restarting\n", id.c_str());
  });
  return 0;
}

}  // namespace

void add_cluster_task_commands(CLI::App* task, Handlers& h) {
  auto o = std::make_shared<ClusterTaskOptions>();
  CLI::App* restart = task->add_subcommand(
      "restart",
      "restart a task of the cluster where it runs (its job's TaskController is asked "
      "first); through the control plane");
  restart->add_option("id", o->id, "the task's id (job.index.N: weftctl task ls --cluster)")
      ->required();
  h.on(restart, [o](const Globals& g) { return task_restart(g, o->id); });
  CLI::App* signal = task->add_subcommand(
      "signal", "send a signal to a task of the cluster, through the control plane");
  signal->add_option("id", o->id, "the task's id (job.index.N)")->required();
  signal->add_option("signal", o->sig, "a signal's name, such as SIGHUP")->required();
  h.on(signal, [o](const Globals& g) { return cluster_task_signal(g, o->id, o->sig); });
}

}  // namespace weft::cli
