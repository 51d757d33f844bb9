// weftctl's shared helpers: the daemons' sockets, errors, tables.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/rpc/client.h"

namespace weft::cli {

using json = nlohmann::json;

struct Globals {
  std::string agent = "/run/weft/agent.sock";
  std::string sidekick = "/run/weft/sidekick.sock";
  std::string hcs = "/run/weft/hcs.sock";
  std::string controlplane = "/run/weft/controlplane.sock";
  // The control plane over TCP: "tls://host:port" with this certificate, key and CA
  // (flags > WEFT_TLS_* > weftctl.toml, the way kubeconfig and NOMAD_CLIENT_CERT work).
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  bool json_out = false;
};

// weftctl.toml ($WEFTCTL_CONFIG, else ~/.config/weft/weftctl.toml, else
// /etc/weft/weftctl.toml; none is fine), then the environment, into `g`; flags are
// parsed after and win. Errors name the file and line.
Status load_cli_config(Globals& g);
// The control plane's session: its Unix socket, or TCP with mutual TLS. `endpoint`: which
// of those given it is; `after`: one to try last (it just went away).
std::unique_ptr<rpc::Client> connect_controlplane(const Globals& g, std::string* endpoint = nullptr,
                                                  const std::string& after = "");
// controlplane.status of each endpoint given (replicas), or its error.
json controlplane_statuses(const Globals& g);

[[noreturn]] inline void die(const std::string& msg, int code = 1) {
  std::cerr << "weftctl: " << msg << "\n";
  std::exit(code);
}

inline std::unique_ptr<rpc::Client> connect_or_die(const std::string& ep, const char* daemon,
                                                   const char* flag) {
  auto c = rpc::Client::connect(ep);
  if (!c.ok()) die(c.error().str() + " (is " + daemon + " running? " + flag + " picks the socket)");
  return std::move(c).value();
}

inline json call_or_die(rpc::Client& c, const std::string& method, const json& params,
                        int timeout_ms = 30000) {
  auto r = c.call(method, params, timeout_ms);
  if (!r.ok()) die(r.error().str());
  return std::move(r).value();
}

// Whether a control plane call may be made again after its session was lost before the
// answer: reads, and changes that set a value (a second one finds it set). A create, an
// update (a new generation each time), a stop or a removal may have been done already.
bool safe_to_repeat(const std::string& method);

// weftctl's session with the control plane (connect_controlplane). Given several
// endpoints (replicas, or a region's front ends), a call whose session is lost before its
// answer (the process killed mid-call) is made again on another one when safe_to_repeat;
// any other fails, saying it may or may not have been done and how to look.
class CpClient {
 public:
  explicit CpClient(Globals g) : g_(std::move(g)), client_(connect_controlplane(g_, &at_)) {}
  Result<json> call(const std::string& method, const json& params, int timeout_ms = 30000);
  rpc::Client& raw() { return *client_; }

 private:
  Globals g_;
  std::string at_;  // the endpoint of client_
  std::unique_ptr<rpc::Client> client_;
};

inline json call_or_die(CpClient& c, const std::string& method, const json& params,
                        int timeout_ms = 30000) {
  auto r = c.call(method, params, timeout_ms);
  if (!r.ok()) die(r.error().str());
  return std::move(r).value();
}

// The one printer: the reply as JSON with --json, else the human form.
inline void print_json_or(const Globals& g, const json& j, const std::function<void()>& human) {
  if (g.json_out)
    std::cout << j.dump(2) << "\n";
  else
    human();
}

inline std::string str_or(const json& j, const char* key, const std::string& dflt = "-") {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (j[key].is_string())
    return j[key].get<std::string>().empty() ? dflt : j[key].get<std::string>();
  return j[key].dump();
}

inline void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

inline void print_kv(const json& j, const std::string& indent = "") {
  for (const auto& [k, v] : j.items()) {
    if (v.is_object() && !v.empty()) {
      std::cout << indent << k << ":\n";
      print_kv(v, indent + "  ");
    } else if (v.is_array()) {
      std::string s;
      for (const auto& x : v)
        s += (s.empty() ? "" : " ") + (x.is_string() ? x.get<std::string>() : x.dump());
      std::cout << indent << k << ": " << (s.empty() ? "-" : s) << "\n";
    } else {
      std::cout << indent << k << ": "
                << (v.is_string() ? (v.get<std::string>().empty() ? "-" : v.get<std::string>())
                    : v.is_null() ? "-"
                                  : v.dump())
                << "\n";
    }
  }
}

}  // namespace weft::cli
