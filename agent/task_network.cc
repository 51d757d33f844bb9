#include "agent/task_network.h"

#include "agent/manager.h"
#include "common/log.h"

namespace weft::agent {

using json = nlohmann::json;

void TaskNetwork::after_recovery() {
  if (!bridge_) return;
  // After a crash: what the live tasks need, and nothing a dead start left behind.
  auto swept = bridge_->sweep();
  if (!swept.ok())
    log_warn("could not sweep the bridge's ports", {{"ERROR", swept.error().str()}});
  else if (*swept > 0)
    log_info("removed veths no live task holds", {{"COUNT", std::to_string(*swept)}});
  publish_bridge();
}

void TaskNetwork::publish_bridge() {
  if (!bridge_) return;
  std::map<std::string, Published> want;
  for (const auto& [id, t] : m_.tasks_) {
    if (t->bridge_addr == 0 || t->terminal() || t->spec.ports.empty()) continue;
    Published p;
    p.addr = t->bridge_addr;
    for (const auto& [name, port] : t->spec.ports) p.ports.push_back(port);
    want[id] = std::move(p);
  }
  Status s = bridge_->publish(want);
  if (!s.ok()) log_error("could not publish the bridge tasks' ports", {{"ERROR", s.error().str()}});
}

Status TaskNetwork::resolve_network(TaskSpec* spec) const {
  // "own": the bridge where this machine has one, else a private namespace; the task
  // keeps what it got (its stored spec says which).
  if (spec->ns.network == NetworkMode::kOwn) {
    spec->ns.network = bridge_ ? NetworkMode::kBridge : NetworkMode::kPrivate;
    if (!bridge_ && !spec->ports.empty())
      return field_error(
                 "namespaces.network",
                 "the task's ports are published through the machine's bridge, and "
                 "this machine has none (agent.toml [bridge]" +
                     (bridge_failure_.empty() ? std::string(")") : ": " + bridge_failure_ + ")") +
                     "; a job may ask for namespaces.network = \"host\" where its "
                     "entitlement grants host_network")
          .with_code(rpc::kUnsupported);
  }
  return refuse_without_bridge(*spec);
}

Status TaskNetwork::refuse_without_bridge(const TaskSpec& spec) const {
  if (spec.ns.network != NetworkMode::kBridge || bridge_) return {};
  return field_error(
             "namespaces.network",
             bridge_failure_.empty()
                 ? "\"bridge\" needs a bridge on the machine: this agent has none "
                   "(agent.toml [bridge])"
                 : "\"bridge\": this machine's bridge could not be made: " + bridge_failure_)
      .with_code(rpc::kUnsupported);
}

Result<Fd> TaskNetwork::task_netns(Task& t, bool bridged) {
  Fd netns = netns_pool_->take();
  if (!netns.valid() && !netns_pool_failure_logged_ && !netns_pool_->failure().empty()) {
    netns_pool_failure_logged_ = true;
    log_warn("network namespaces are made at each start (netns_pool stopped)",
             {{"ERROR", netns_pool_->failure()}});
  }
  if (!bridged) return netns;  // none ready: the child makes its own
  if (!netns.valid()) {
    // Plugged into the bridge before the task runs: made here, not by the child.
    auto made = make_netns();
    if (!made.ok()) return std::move(made).error().wrap("network namespace");
    netns = std::move(made).value();
  }
  Status plugged = bridge_->attach(netns.get(), t.bridge_addr);
  if (!plugged.ok()) return std::move(plugged).error().wrap("bridge " + bridge_->name());
  return netns;
}

}  // namespace weft::agent
