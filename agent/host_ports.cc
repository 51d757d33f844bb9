#include "agent/host_ports.h"

#include "agent/agent_conf.h"
#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc/endpoint.h"
#include "common/strings.h"

namespace weft::agent {

std::set<uint16_t> parse_proc_net_listeners(std::string_view table, bool udp) {
  // "  sl  local_address rem_address   st ...": local_address is ADDR:PORT in hex.
  std::set<uint16_t> out;
  size_t at = table.find('\n');  // the header
  while (at != std::string_view::npos && at < table.size()) {
    size_t end = table.find('\n', at + 1);
    std::string_view line =
        table.substr(at + 1, end == std::string_view::npos ? std::string_view::npos : end - at - 1);
    at = end;
    std::vector<std::string> f;
    for (const auto& w : split(line, ' '))
      if (!w.empty()) f.push_back(w);
    if (f.size() < 4) continue;
    const std::string& local = f[1];
    const std::string& state = f[3];
    size_t colon = local.rfind(':');
    if (colon == std::string::npos || local.size() - colon - 1 != 4) continue;
    if (state != (udp ? "07" : "0A")) continue;
    unsigned port = 0;
    bool ok = true;
    for (char c : local.substr(colon + 1)) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) ok = false;
      port = port * 16 + static_cast<unsigned>(d < 0 ? 0 : d);
    }
    if (ok && port != 0) out.insert(static_cast<uint16_t>(port));
  }
  return out;
}

const std::set<uint16_t>& HostPorts::listening() const {
  if (listening_) return *listening_;
  std::set<uint16_t> out;
  for (auto [name, udp] :
       {std::pair{"tcp", false}, {"tcp6", false}, {"udp", true}, {"udp6", true}}) {
    auto text = read_file(proc_net_ + "/" + name);
    if (!text.ok()) continue;  // no IPv6 on this machine, say
    auto ports = parse_proc_net_listeners(*text, udp);
    out.insert(ports.begin(), ports.end());
  }
  listening_ = std::move(out);
  return *listening_;
}

std::string HostPorts::why_reserved(uint16_t port) const {
  if (reserved_.count(port))
    return "reserved on this machine (agent.toml reserved_ports, or a port of weft's own)";
  if (listening().count(port)) return "served by the machine itself (a listener on the host)";
  return "";
}

std::set<uint16_t> HostPorts::snapshot(size_t max) const {
  std::set<uint16_t> out = reserved_;
  const auto& now = listening();
  out.insert(now.begin(), now.end());
  while (out.size() > max) out.erase(std::prev(out.end()));
  return out;
}

HostPorts host_ports_of(const AgentConfig& cfg) {
  std::set<uint16_t> reserved = cfg.reserved_ports;
  for (const std::string* listen : {&cfg.dns_listen, &cfg.metrics_listen})
    if (auto ep = rpc::parse_endpoint(*listen); !listen->empty() && ep.ok() && !ep->is_unix)
      reserved.insert(ep->port);
  reserved.insert(cfg.bridge_host_ports.begin(), cfg.bridge_host_ports.end());
  return HostPorts(std::move(reserved), HostPaths(cfg.host_root).proc("net"));
}

}  // namespace weft::agent
