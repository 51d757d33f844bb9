#include "controlplane/api/access.h"

#include "common/log.h"
#include "common/rpc/protocol.h"

#include <algorithm>

namespace weft::cp {

const char* role_name(Role r) {
  switch (r) {
    case Role::kViewer:
      return "viewer";
    case Role::kOperator:
      return "operator";
    case Role::kAdmin:
      return "admin";
    case Role::kNone:
      break;
  }
  return "none";
}

namespace {

constexpr size_t kMaxPattern = 1024;

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

Status check_principal_pattern(const std::string& p) {
  if (p.empty() || p.size() > kMaxPattern)
    return make_error("a principal must be 1-1024 characters");
  for (unsigned char ch : p)
    if (ch < 0x20 || ch == 0x7f) return make_error("a principal has no control characters");
  auto eq = p.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == p.size())
    return make_error("'" + p + "' is not a principal (CN=, OU=, O=, DNS= or a whole subject)");
  std::string kind = p.substr(0, eq);
  if (p.find(',') != std::string::npos) return {};  // a whole subject
  if (kind == "CN" || kind == "OU" || kind == "O" || kind == "DNS") return {};
  return make_error("'" + p + "': '" + kind + "=' is not one of CN=, OU=, O=, DNS=");
}

bool principal_matches(const std::string& pattern, const tls::Identity& id) {
  auto eq = pattern.find('=');
  if (eq == std::string::npos) return false;
  if (pattern.find(',') != std::string::npos) return pattern == id.subject;
  std::string kind = pattern.substr(0, eq), value = pattern.substr(eq + 1);
  if (kind == "CN") return !id.common_name.empty() && id.common_name == value;
  if (kind == "OU") return contains(id.units, value);
  if (kind == "DNS") return contains(id.dns, value);
  if (kind == "O") {
    // The subject in RFC 2253 form lists "O=<value>" as one of its comma-separated parts.
    size_t start = 0;
    const std::string& s = id.subject;
    while (start <= s.size()) {
      size_t end = s.find(',', start);
      if (end == std::string::npos) end = s.size();
      if (s.compare(start, end - start, pattern) == 0) return true;
      start = end + 1;
    }
  }
  return false;
}

bool any_matches(const std::vector<std::string>& patterns, const tls::Identity& id) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&id](const std::string& p) { return principal_matches(p, id); });
}

Role AccessConfig::role_of(const tls::Identity& id) const {
  if (any_matches(admin, id)) return Role::kAdmin;
  if (any_matches(op, id)) return Role::kOperator;
  if (any_matches(viewer, id)) return Role::kViewer;
  return Role::kNone;
}

Result<AccessConfig> parse_access(const TomlDoc& doc, const toml::table* t) {
  AccessConfig a;
  if (!t) return a;
  TRY(doc.only_keys(*t, "access.",
                    {"machine", "viewer", "operator", "admin", "logs", "front_end", "shard"}));
  for (auto [key, out] : {std::pair{"machine", &a.machine},
                          {"viewer", &a.viewer},
                          {"operator", &a.op},
                          {"admin", &a.admin},
                          {"logs", &a.logs},
                          {"front_end", &a.front_end},
                          {"shard", &a.shard}}) {
    TRY_ASSIGN(auto list, doc.get_string_list(*t, key));
    if (!list) continue;
    for (const auto& p : *list)
      if (auto s = check_principal_pattern(p); !s.ok())
        return field_error(doc.where(*t->get(key)),
                           std::string("'access.") + key + "': " + s.error().message);
    *out = std::move(*list);
  }
  return a;
}

Role parse_role(const std::string& name) {
  for (Role r : {Role::kViewer, Role::kOperator, Role::kAdmin})
    if (name == role_name(r)) return r;
  return Role::kNone;
}

Caller identify_caller(const rpc::Peer& p, const AccessConfig& access, int gid,
                       const std::string& group) {
  Caller w;
  if (!p.via.empty()) {  // carried by a front end: the operator as it verified them
    w.who = (p.tls ? p.identity.subject : p.address) + " via " + p.via;
    w.role = parse_role(p.via_role);
    if (p.tls) w.id = &p.identity;
    return w;
  }
  if (p.is_unix) {
    w.unix_socket = true;
    w.who = "uid " + std::to_string(p.uid) + " (pid " + std::to_string(p.pid) + ")";
    if (rpc::require_privileged(p, gid, group, "calling the control plane").ok()) {
      w.role = Role::kAdmin;
      w.machine = true;
    }
    return w;
  }
  if (!p.tls) {  // plaintext TCP: loopback tests or insecure_listen; machines only
    w.who = p.address;
    w.machine = true;
    return w;
  }
  w.id = &p.identity;
  w.who = p.identity.subject;
  w.role = access.role_of(p.identity);
  w.machine = access.is_machine(p.identity);
  return w;
}

Status permit_call(const Caller& who, int access, const std::string& method,
                   const std::string& group) {
  static const Role kNeeds[] = {Role::kNone, Role::kNone, Role::kViewer, Role::kOperator,
                                Role::kAdmin};
  if (access < 0 || access > kAdminCall) access = kAdminCall;
  bool ok = access == kMachineCall ? who.machine : who.role >= kNeeds[access];
  if (ok) return {};
  std::string why;
  if (who.unix_socket)
    why = "on the Unix socket only root and the '" + group + "' group are served";
  else if (!who.id && who.role == Role::kNone)
    why = "over plaintext TCP only machine calls are served; " + method +
          " needs a TLS client certificate";
  else if (access == kMachineCall)
    why = method + " is a machine call: the certificate must match access.machine";
  else
    why = method + " needs the " + role_name(kNeeds[access]) + " role; the caller's role is " +
          role_name(who.role);
  log_warn("call refused", {{"PEER", who.who}, {"METHOD", method}, {"WHY", why}});
  return make_error(who.who + ": " + why).with_code(rpc::kPermissionDenied);
}

bool may_operate(const Caller& c, const std::vector<std::string>& owners) {
  if (c.role == Role::kAdmin) return true;
  if (c.role != Role::kOperator || !c.id) return false;
  return any_matches(owners, *c.id);
}

}  // namespace weft::cp
