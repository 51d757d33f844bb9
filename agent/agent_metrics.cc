#include "agent/agent_metrics.h"

#include "agent/manager.h"

namespace weft::agent {

using json = nlohmann::json;

void AgentMetrics::register_metrics() {
  metrics_.add([this](metrics::Writer& w) {
    std::map<std::string, size_t> by_state;
    for (const auto& [id, t] : m_.tasks_) ++by_state[task_state_name(t->state)];
    w.family("weft_agent_tasks", "gauge", "Tasks on this machine, by state.");
    for (const auto& [state, n] : by_state)
      w.sample("weft_agent_tasks", static_cast<double>(n), {{"state", state}});
    w.family("weft_agent_task_starts_total", "counter", "Task incarnations started.");
    w.sample("weft_agent_task_starts_total", static_cast<double>(starts_));
    w.family("weft_agent_task_start_seconds", "histogram",
             "From a start's beginning to the task's init running (cgroup, namespaces, "
             "mounts, exec).");
    start_seconds_.write(w, "weft_agent_task_start_seconds");
    w.family("weft_agent_task_restarts_total", "counter", "Restarts after a task ended.");
    w.sample("weft_agent_task_restarts_total", static_cast<double>(restarts_));
    if (m_.cp_calls_.discovery_) m_.cp_calls_.discovery_->write_metrics(w);
    w.family("weft_agent_oom_kills_total", "counter", "Task incarnations ended by the OOM killer.");
    w.sample("weft_agent_oom_kills_total", static_cast<double>(oom_kills_));
    w.family("weft_agent_state_write_failures_total", "counter",
             "Task records state_dir did not take (a full or failing disk): a start so "
             "refused, or a change kept in memory only and logged.");
    w.sample("weft_agent_state_write_failures_total", static_cast<double>(store_failures_));
    w.family("weft_agent_sandboxes_ready", "gauge",
             "Sandboxes made ahead and waiting for a task (agent.toml's sandbox_pool).");
    w.sample("weft_agent_sandboxes_ready", static_cast<double>(m_.sandboxes_->ready()));
    w.family("weft_agent_sandbox_handoffs_total", "counter",
             "Task starts that took a sandbox made ahead (of weft_agent_task_starts_total).");
    w.sample("weft_agent_sandbox_handoffs_total", static_cast<double>(handoffs_));
    w.family("weft_agent_control_plane_connected", "gauge",
             "1 while the session to the control plane is up and registered.");
    w.sample("weft_agent_control_plane_connected",
             m_.cp_calls_.cp_ && m_.cp_calls_.cp_->connected() ? 1 : 0);
  });
}

}  // namespace weft::agent
