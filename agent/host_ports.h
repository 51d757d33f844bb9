// The ports a machine serves itself, which no task may take (docs/services.md): a task's
// fixed port is published on every address of its machine (a bridge task's by DNAT, in
// front of the machine's own listeners), so a job asking for 2222, 7070 or 9471 would
// answer in place of the machine's sshd, its control plane or its metrics.
//
// Three sources: what the operator reserves (agent.toml `reserved_ports`), the agent's
// own listeners (dns_listen, metrics_listen) and the ports bridge tasks may reach on the
// machine (`[bridge] host_ports`), and anything listening on the machine when the task
// starts (its /proc/net tables: TCP in LISTEN, UDP bound). The control plane is told the
// first two and a snapshot of the third at registration, and places no fixed port
// there; the agent checks all three at each start, since a listener may come later.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace weft::agent {

// The local ports of the sockets in one /proc/net/{tcp,tcp6,udp,udp6} table that serve:
// TCP sockets in LISTEN (state 0A), UDP sockets that are not connected (state 07).
// Malformed lines are skipped (the table is the kernel's, but read as text).
std::set<uint16_t> parse_proc_net_listeners(std::string_view table, bool udp);

class HostPorts {
 public:
  // `reserved`: the operator's and the agent's own; `proc_net`: the directory with the
  // machine's tcp, tcp6, udp and udp6 tables ("/proc/net" under the host root).
  HostPorts(std::set<uint16_t> reserved, std::string proc_net)
      : reserved_(std::move(reserved)), proc_net_(std::move(proc_net)) {}
  // Why `port` is the machine's own, or "" when a task may take it. Reads the tables (a
  // few KiB) at the first call and keeps what they said for this object's life: make one
  // per start.
  std::string why_reserved(uint16_t port) const;
  // Reserved and listening now, for the control plane (at most `max`, lowest first).
  std::set<uint16_t> snapshot(size_t max = 4096) const;
  const std::set<uint16_t>& reserved() const { return reserved_; }

 private:
  const std::set<uint16_t>& listening() const;
  std::set<uint16_t> reserved_;
  mutable std::optional<std::set<uint16_t>> listening_;
  std::string proc_net_;
};

struct AgentConfig;
// This agent's: reserved_ports, the ports of dns_listen and metrics_listen, [bridge]
// host_ports; the tables under its host root's /proc/net (its own network namespace's).
HostPorts host_ports_of(const AgentConfig& cfg);

}  // namespace weft::agent
