// weft-hcs's JSON-RPC API (docs/health.md): one named handler per method, listed in
// one table. Every method only reads.
#include "common/clock.h"
#include "hcs/manager.h"

namespace weft::hcs {

using json = nlohmann::json;

void Manager::register_methods() {
  // Every method only reads.
  static const rpc::Method<Manager> kMethods[] = {
      {"health.verdict", &Manager::api_health_verdict},
      {"health.probes", &Manager::api_health_probes},
      {"health.history", &Manager::api_health_history},
  };
  rpc::add_methods(methods_, this, kMethods);
}

Result<json> Manager::api_health_verdict(const json&, const rpc::CallContext&) {
  return verdict_json();
}

Result<json> Manager::api_health_probes(const json&, const rpc::CallContext&) {
  json arr = json::array();
  for (const auto& [name, st] : states_) {
    json j{{"probe", name},
           {"state", health_name(st.state())},
           {"detail", st.detail()},
           {"since", format_rfc3339(static_cast<int64_t>(st.since_us()))},
           {"pinned", st.pinned()}};
    if (auto it = last_.find(name); it != last_.end()) {
      j["last_sample"] = health_name(it->second.health);
      j["metrics"] = it->second.metrics;
    }
    arr.push_back(j);
  }
  return json{{"published", published_}, {"probes", arr}};
}

Result<json> Manager::api_health_history(const json& p, const rpc::CallContext&) {
  int limit = 50;
  if (p.contains("limit")) {
    if (!p["limit"].is_number_unsigned() || p["limit"].get<int>() < 1)
      return field_error("limit", "must be a positive integer");
    limit = std::min(p["limit"].get<int>(), 10000);
  }
  TRY_ASSIGN(Stmt st, db_->prepare("SELECT at_us, probe, from_state, to_state, detail FROM "
                                   "history ORDER BY id DESC LIMIT ?1"));
  st.bind(1, int64_t{limit});
  json arr = json::array();
  for (;;) {
    TRY_ASSIGN(bool row, st.step());
    if (!row) break;
    arr.push_back({{"at", format_rfc3339(st.col_int(0))},
                   {"probe", st.col_text(1)},
                   {"from", st.col_text(2)},
                   {"to", st.col_text(3)},
                   {"detail", st.col_text(4)}});
  }
  return json{{"transitions", arr}};
}

}  // namespace weft::hcs
