// weft-sidekick's JSON-RPC API (docs/protocol.md): one named handler per method, listed
// in one table with whether it changes the host (root or the socket group only).
#include "sidekick/manager.h"

#include "common/log.h"
#include "sidekick/conflicts.h"

namespace weft::sidekick {

using json = nlohmann::json;
using rpc::RpcCode;

Result<Profile> Manager::load_named(const json& p) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required and must be a profile name");
  std::string name = p["name"].get<std::string>();
  auto prof = load_profile(path(), name);
  if (!prof.ok()) {
    Error e = std::move(prof).error();
    if (e.code == 0)
      e.code = e.message.rfind("no profile named", 0) == 0 ? RpcCode::kNotFound
                                                           : RpcCode::kInvalidParams;
    return e;
  }
  return prof;
}

void Manager::register_methods() {
  // Guarded: changes the host, root or the socket group only (check_privileged).
  static const rpc::Method<Manager> kMethods[] = {
      {"profile.ls", &Manager::api_profile_ls},
      {"profile.show", &Manager::api_profile_show},
      {"profile.active", &Manager::api_profile_active},
      {"profile.plan", &Manager::api_profile_plan},
      {"profile.switch", &Manager::api_profile_switch, rpc::kPrivileged},
      {"profile.verify", &Manager::api_profile_verify},
      {"profile.off", &Manager::api_profile_off, rpc::kPrivileged},
      {"profile.import_tuned", &Manager::api_profile_import_tuned},
      {"profile.history", &Manager::api_profile_history},
  };
  rpc::add_methods(methods_, this, kMethods,
                   [this](const rpc::CallContext& c) { return check_privileged(c.peer); });
}

Result<json> Manager::api_profile_ls(const json&, const rpc::CallContext&) {
  json arr = json::array();
  for (const auto& n : list_profiles(path())) {
    auto prof = load_profile(path(), n);
    arr.push_back({{"name", n},
                   {"description", prof.ok() ? prof->description : ""},
                   {"valid", prof.ok()},
                   {"error", prof.ok() ? "" : prof.error().str()},
                   {"active", engine_->active_profile() == n}});
  }
  return json{{"profiles", arr}};
}

Result<json> Manager::api_profile_show(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(Profile prof, load_named(p));
  json knobs = json::array();
  for (const auto& k : prof.knobs) knobs.push_back(knob_to_json(k));
  return json{{"name", prof.name},
              {"description", prof.description},
              {"files", prof.files},
              {"knobs", knobs}};
}

Result<json> Manager::api_profile_active(const json&, const rpc::CallContext&) {
  auto conv = engine_->convergence();
  return json{{"profile", engine_->active_profile() ? json(*engine_->active_profile()) : json()},
              {"state", last_outcome_},
              {"convergence", conv.ok() ? *conv : json::array()},
              {"last_verify", last_verify_}};
}

Result<json> Manager::api_profile_plan(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(Profile prof, load_named(p));
  TRY_ASSIGN(Plan plan, engine_->plan(prof));
  json changes = json::array();
  for (const auto& c : plan.changes)
    changes.push_back({{"id", c.knob.id},
                       {"from", c.from},
                       {"to", c.knob.value},
                       {"class", class_name(c.knob.klass)},
                       {"required", c.knob.required},
                       {"source", c.knob.source},
                       {"restore", c.restore}});
  return json{{"from", plan.from_profile},
              {"to", plan.to_profile},
              {"changes", changes},
              {"unchanged", plan.unchanged.size()},
              {"reboot_pending", plan.reboot_pending}};
}

Result<json> Manager::api_profile_switch(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(Profile prof, load_named(p));
  SwitchReport rep = switch_to(prof);
  json j = rep.to_json();
  j["conflicts"] = conflicts_json(prof);
  return j;
}

Result<json> Manager::api_profile_verify(const json&, const rpc::CallContext&) {
  SwitchReport rep = engine_->verify();
  last_verify_ = rep.to_json();
  return last_verify_;
}

Result<json> Manager::api_profile_off(const json&, const rpc::CallContext&) {
  SwitchReport rep = engine_->off();
  last_outcome_ = outcome_name(rep.outcome);
  update_status();
  return rep.to_json();
}

Result<json> Manager::api_profile_history(const json& p, const rpc::CallContext&) {
  int limit = 20;
  if (p.contains("limit")) {
    if (!p["limit"].is_number_unsigned() || p["limit"].get<int>() < 1)
      return field_error("limit", "must be a positive integer");
    limit = std::min(p["limit"].get<int>(), 1000);
  }
  TRY_ASSIGN(json h, engine_->history(limit));
  return json{{"switches", h}};
}

Result<json> Manager::api_profile_import_tuned(const json& p, const rpc::CallContext&) {
  if (!p.is_object() || !p.contains("text") || !p["text"].is_string())
    return field_error("text", "is required: the TuneD tuned.conf contents");
  std::string name = p.value("name", "imported");
  TunedImport r = import_tuned(p["text"].get<std::string>(), name);
  auto check = parse_profile_text(r.toml, name + ".toml");
  return json{{"toml", r.toml},
              {"unconverted", r.unconverted},
              {"valid", check.ok()},
              {"error", check.ok() ? "" : check.error().str()}};
}

}  // namespace weft::sidekick
