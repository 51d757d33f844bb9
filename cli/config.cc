// weftctl's own configuration: where the control plane is and which certificate speaks
// for the operator.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>

#include "cli/cli_config.h"
#include "cli/tls_helper.h"
#include "cli/util.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/cp_link.h"
#include "common/fs.h"
#include "common/tls.h"

namespace weft::cli {

Status load_cli_config(Globals& g) {
  std::string path;  // the file to read ($WEFTCTL_CONFIG must exist; the others may not)
  if (const char* e = std::getenv("WEFTCTL_CONFIG"); e && *e) {
    path = e;
  } else if (const char* home = std::getenv("HOME");
             home && *home && path_exists(std::string(home) + "/.config/weft/weftctl.toml")) {
    path = std::string(home) + "/.config/weft/weftctl.toml";
  } else if (path_exists("/etc/weft/weftctl.toml")) {
    path = "/etc/weft/weftctl.toml";
  }
  if (!path.empty()) {
    TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
    TRY_ASSIGN(CliConfig file, parse_cli_config(text, path));
    for (auto [from, to] : {std::pair{&file.controlplane, &g.controlplane},
                            {&file.tls_ca, &g.tls_ca},
                            {&file.tls_cert, &g.tls_cert},
                            {&file.tls_key, &g.tls_key},
                            {&file.tls_server_name, &g.tls_server_name}})
      if (!from->empty()) *to = *from;
  }
  for (auto [var, out] : {std::pair{"WEFT_CONTROLPLANE", &g.controlplane},
                          {"WEFT_TLS_CA", &g.tls_ca},
                          {"WEFT_TLS_CERT", &g.tls_cert},
                          {"WEFT_TLS_KEY", &g.tls_key},
                          {"WEFT_TLS_SERVER_NAME", &g.tls_server_name}})
    if (const char* e = std::getenv(var); e && *e) *out = e;
  return {};
}

namespace {

bool is_tcp(const std::string& endpoint) {
  if (endpoint.rfind("tls://", 0) == 0) return true;
  auto ep = rpc::parse_endpoint(endpoint);
  return ep.ok() && !ep->is_unix;
}

Result<std::unique_ptr<rpc::Client>> connect_one(const Globals& g, const std::string& endpoint) {
  if (!is_tcp(endpoint)) return rpc::Client::connect(endpoint);
  if (g.tls_cert.empty() || g.tls_key.empty() || g.tls_ca.empty())
    die("the control plane at " + endpoint +
        " is TCP: give a certificate, key and CA bundle (--tls-cert, --tls-key, --tls-ca; "
        "WEFT_TLS_CERT, WEFT_TLS_KEY, WEFT_TLS_CA; or weftctl.toml)");
  tls::Config cfg{g.tls_ca, g.tls_cert, g.tls_key, ""};
  auto t = client_tls(cfg, g.tls_server_name);  // weftctl: weftctl-tls takes over here
  if (!t.ok()) die(t.error().str());
  return rpc::Client::connect(endpoint, rpc::kDefaultMaxLine, &*t);
}

}  // namespace

json controlplane_statuses(const Globals& g) {
  json out = json::array();
  for (const auto& ep : split_endpoints(g.controlplane)) {
    json row{{"endpoint", ep}};
    auto c = connect_one(g, ep);
    auto st =
        c.ok() ? (*c)->call("controlplane.status", json::object(), 5000) : Result<json>(c.error());
    if (st.ok())
      row.update(*st);
    else
      row["error"] = st.error().str();
    out.push_back(row);
  }
  return out;
}

std::unique_ptr<rpc::Client> connect_controlplane(const Globals& g, std::string* endpoint,
                                                  const std::string& after) {
  std::vector<std::string> endpoints = split_endpoints(g.controlplane);
  if (auto it = std::find(endpoints.begin(), endpoints.end(), after); it != endpoints.end())
    std::rotate(endpoints.begin(), it + 1, endpoints.end());
  if (endpoint) *endpoint = g.controlplane;
  if (endpoints.size() <= 1) {
    auto c = connect_one(g, g.controlplane);
    if (!c.ok()) die(c.error().str() + " (is weft-controlplane running there? --controlplane)");
    return std::move(c).value();
  }
  // Replicas (docs/replicas.md): the one that leads, asked with controlplane.status,
  // which followers answer too. A follower names the leader; its address is tried next
  // when it is one of those given. During a failover no replica leads for a few
  // seconds: the round is repeated for up to 15 s.
  std::string why;
  auto deadline = now_monotonic_us() + 15'000'000;
  size_t i = 0;
  for (int tries = 0;; ++tries) {
    const std::string& ep = endpoints[i % endpoints.size()];
    auto c = connect_one(g, ep);
    std::string leader;
    if (!c.ok()) {
      why = ep + ": " + c.error().str();
    } else {
      auto st = (*c)->call("controlplane.status", json::object(), 5000);
      if (st.ok() && st->value("leading", false)) {
        if (endpoint) *endpoint = ep;
        return std::move(c).value();
      }
      if (st.ok()) {
        leader = st->value("leader", std::string());
        why = ep + ": follows" + (leader.empty() ? "; no leader known" : "; leader " + leader);
      } else {
        why = ep + ": " + st.error().str();
      }
    }
    auto it = std::find(endpoints.begin(), endpoints.end(), leader);
    i = it != endpoints.end() ? static_cast<size_t>(it - endpoints.begin()) : i + 1;
    if (now_monotonic_us() > deadline)
      die("no control plane replica leads (last: " + why + "); tried " + g.controlplane);
    if (tries % endpoints.size() == endpoints.size() - 1) ::usleep(250'000);
  }
}

bool safe_to_repeat(const std::string& method) {
  static const std::set<std::string> kSetters = {"job.scale", "entitlement.update",
                                                 "machine.drain"};
  auto ends = [&](const char* s) {
    std::string suffix(s);
    return method.size() > suffix.size() &&
           method.compare(method.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".ls") || ends(".show") || ends(".status") || ends(".watch") ||
         method == "web.page" || method == "task.logs" || kSetters.count(method) > 0;
}

Result<json> CpClient::call(const std::string& method, const json& params, int timeout_ms) {
  size_t endpoints = split_endpoints(g_.controlplane).size();
  for (size_t attempt = 0;; ++attempt) {
    auto r = client_->call(method, params, timeout_ms);
    // kUnavailable: the session ended before the answer (the far end closed or reset
    // it); an answer of any kind, even an error, is the control plane's word.
    if (r.ok() || r.error().code != rpc::kUnavailable || endpoints <= 1) return r;
    const std::string where = at_;
    if (!safe_to_repeat(method))
      return make_error(method + ": the control plane at " + where +
                        " went away before answering (" + r.error().message +
                        "); it may or may not have been done: look (e.g. weftctl job show, "
                        "job ls, entitlement ls) before trying again")
          .with_code(rpc::kUnavailable);
    if (attempt + 1 >= endpoints) return r;
    std::cerr << "weftctl: " << where << " went away before answering " << method
              << "; asking another of " << g_.controlplane << "\n";
    client_ = connect_controlplane(g_, &at_, where);
  }
}

}  // namespace weft::cli
