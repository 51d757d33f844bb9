// The shard's side of a region (docs/regions.md): the calls its front ends carry.
#include "common/log.h"
#include "controlplane/manager.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {

// The operator's certificate as a front end carries it ({"subject", "cn", "ou", "dns"}):
// hostile input like any parameter.
Status read_identity(const json& j, tls::Identity* id) {
  if (!j.is_object()) return field_error("caller.identity", "must be an object");
  auto text = [&](const char* key, std::string* out) -> Status {
    if (!j.contains(key)) return {};
    if (!j[key].is_string() || j[key].get_ref<const std::string&>().size() > 1024)
      return field_error(std::string("caller.identity.") + key, "must be a string");
    *out = j[key].get<std::string>();
    return {};
  };
  auto list = [&](const char* key, std::vector<std::string>* out) -> Status {
    if (!j.contains(key)) return {};
    const json& a = j[key];
    if (!a.is_array() || a.size() > 64)
      return field_error(std::string("caller.identity.") + key, "must be a list of strings");
    for (const json& v : a) {
      if (!v.is_string() || v.get_ref<const std::string&>().size() > 1024)
        return field_error(std::string("caller.identity.") + key, "must be a list of strings");
      out->push_back(v.get<std::string>());
    }
    return {};
  };
  TRY(text("subject", &id->subject));
  TRY(text("cn", &id->common_name));
  TRY(list("ou", &id->units));
  TRY(list("dns", &id->dns));
  if (id->subject.empty()) return field_error("caller.identity.subject", "is required");
  return {};
}

}  // namespace

Result<json> Manager::api_frontend_forward(const json& p, const CallContext& c) {
  // Only a front end may speak for an operator: its certificate (access.front_end), or a
  // privileged peer on this host's Unix socket (root or the weft group: an admin already).
  Caller fe = caller(c);
  bool front_end = c.peer.via.empty() && (c.peer.tls ? cfg_.access.is_front_end(c.peer.identity)
                                                     : fe.unix_socket && fe.role == Role::kAdmin);
  if (!front_end) {
    log_warn("call refused", {{"PEER", fe.who},
                              {"METHOD", "frontend.forward"},
                              {"WHY", "not a front end (access.front_end)"}});
    return make_error(fe.who +
                      ": frontend.forward is for a region's front ends (a certificate "
                      "matching access.front_end)")
        .with_code(rpc::kPermissionDenied);
  }
  if (!p.is_object()) return field_error("params", "must be an object");
  if (!p.contains("method") || !p["method"].is_string())
    return field_error("method", "must be a method name");
  std::string method = p["method"].get<std::string>();
  if (method == "frontend.forward" || method.rfind("machine.register", 0) == 0 ||
      method == "machine.heartbeat" || method == "machine.report" || method == "health.report" ||
      method == "profile.report")
    return field_error("method", method + " cannot be carried by a front end");
  const rpc::Handler* h = methods_.find(method);
  if (!h) return make_error("no such method: " + method).with_code(rpc::kMethodNotFound);
  if (!p.contains("caller") || !p["caller"].is_object())
    return field_error("caller", "must name the operator");
  const json& who = p["caller"];
  if (!who.contains("role") || !who["role"].is_string())
    return field_error("caller.role", "must be viewer, operator or admin");
  rpc::Peer op;
  op.via = fe.who;
  op.via_role = who["role"].get<std::string>();
  if (parse_role(op.via_role) == Role::kNone)
    return field_error("caller.role", "must be viewer, operator or admin");
  if (who.contains("identity")) {
    TRY(read_identity(who["identity"], &op.identity));
    op.tls = true;
  } else {
    if (!who.contains("who") || !who["who"].is_string() ||
        who["who"].get_ref<const std::string&>().size() > 256)
      return field_error("caller.who", "must name the operator");
    op.address = who["who"].get<std::string>();
  }
  json params = p.contains("params") ? p["params"] : json::object();
  return (*h)(params, CallContext{c.session, op});
}

}  // namespace weft::cp
