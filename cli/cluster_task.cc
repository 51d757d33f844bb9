#include "cli/cluster_task.h"

#include <cstdio>
#include <iostream>

namespace weft::cli {

void add_cluster_task_commands(TaskCommands& t, ClusterTaskCommands& c) {
  c.restart = t.task->add_subcommand(
      "restart",
      "restart a task of the cluster where it runs (its job's TaskController is asked "
      "first); through the control plane");
  c.restart->add_option("id", c.id, "the task's id (job.index.N: weftctl task ls --cluster)")
      ->required();
  c.signal = t.task->add_subcommand(
      "signal", "send a signal to a task of the cluster, through the control plane");
  c.signal->add_option("id", c.id, "the task's id (job.index.N)")->required();
  c.signal->add_option("signal", c.sig, "a signal's name, such as SIGHUP")->required();
  t.show->add_flag("--cluster", c.show_cluster,
                   "ask the control plane, wherever the task runs (its record, and its agent's "
                   "detail)");
  t.kill->add_flag("--cluster", c.kill_cluster,
                   "through the control plane, wherever the task runs (it is replaced as a "
                   "failed task is)");
}

int run_cluster_task_commands(const TaskCommands& t, const ClusterTaskCommands& c,
                              const Globals& g) {
  const bool show = t.show && t.show->parsed() && c.show_cluster;
  const bool kill = t.kill && t.kill->parsed() && c.kill_cluster;
  const bool restart = c.restart && c.restart->parsed();
  const bool signal = c.signal && c.signal->parsed();
  if (!show && !kill && !restart && !signal) return -1;
  CpClient cp(g);
  const std::string id = show || kill ? t.id : c.id;
  if (show) {
    json r = call_or_die(cp, "task.show", {{"id", id}}, 15000);
    print_json_or(g, r, [&] {
      std::printf("task %s: %s on %s (job %s, generation %s)%s\n", str_or(r, "id").c_str(),
                  str_or(r, "state").c_str(), str_or(r, "machine").c_str(),
                  str_or(r, "job").c_str(), str_or(r, "generation").c_str(),
                  r.value("ready", false) ? ", ready" : "");
      if (r.contains("agent")) {
        std::cout << "\nits agent says:\n" << r["agent"].dump(2) << "\n";
      } else {
        std::printf("its agent: %s\n", str_or(r, "agent_error").c_str());
      }
    });
    return 0;
  }
  if (restart) {
    json r = call_or_die(cp, "task.restart", {{"id", id}});
    print_json_or(g, r, [&] {
      if (r.value("waiting_for_controller", false))
        std::printf("task %s: restart asked of job %s's TaskController\n", id.c_str(),
                    str_or(r, "job").c_str());
      else
        std::printf("task %s: restarting\n", id.c_str());
    });
    return 0;
  }
  const std::string sig = kill ? (t.sig.empty() ? std::string("SIGKILL") : t.sig) : c.sig;
  json r = call_or_die(cp, "task.signal", {{"id", id}, {"signal", sig}});
  print_json_or(g, r, [&] { std::printf("task %s: %s sent\n", id.c_str(), sig.c_str()); });
  return 0;
}

}  // namespace weft::cli
