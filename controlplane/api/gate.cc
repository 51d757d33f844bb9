#include "controlplane/api/gate.h"

#include <algorithm>

#include "common/log.h"
#include "controlplane/api/cp_server.h"
#include "controlplane/region/region.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

Caller Gate::caller(const CallContext& c) const {
  return identify_caller(c.peer, access_, server_.socket_gid(), socket_group_);
}

Status Gate::permit(const Caller& who, int access, const std::string& method) const {
  return permit_call(who, access, method, socket_group_);
}

Status Gate::may_change_jobs(const Caller& who, EntitlementId e) const {
  auto it = broker_.entitlements().find(e);
  if (it == broker_.entitlements().end()) return {};  // the operation reports it
  if (may_operate(who, it->second.owners)) return {};
  std::string owners;
  for (const auto& o : it->second.owners) owners += (owners.empty() ? "" : ", ") + o;
  return make_error(who.who + " may not change jobs in entitlement '" + it->second.name +
                    "' (owners: " + (owners.empty() ? "none" : owners) + "; and admins)")
      .with_code(rpc::kPermissionDenied);
}

bool Gate::front_end_call(const CallContext& c, const char* method) const {
  // Only a front end may speak for an operator: its certificate (access.front_end), or a
  // privileged peer on this host's Unix socket (root or the weft group: an admin already).
  Caller fe = caller(c);
  bool front_end = c.peer.via.empty() && (c.peer.tls ? access_.is_front_end(c.peer.identity)
                                                     : fe.unix_socket && fe.role == Role::kAdmin);
  if (!front_end)
    log_warn("call refused",
             {{"PEER", fe.who}, {"METHOD", method}, {"WHY", "not a front end (access.front_end)"}});
  return front_end;
}

Result<std::string> Gate::calling_shard(const json& p, const CallContext& c) const {
  if (!p.is_object() || !p.contains("shard") || !p["shard"].is_string())
    return field_error("shard", "must name the calling shard");
  std::string shard = p["shard"].get<std::string>();
  TRY(check_shard_id("shard", shard));
  Caller who = caller(c);
  bool ok = c.peer.via.empty() &&
            (c.peer.tls ? access_.is_shard(c.peer.identity) && c.peer.identity.common_name == shard
                        : who.unix_socket && who.role == Role::kAdmin);
  if (!ok) {
    log_warn("call refused",
             {{"PEER", who.who}, {"METHOD", "pool"}, {"WHY", "not shard " + shard}});
    return make_error(who.who + ": only shard " + shard +
                      " may borrow or give back its machines (a certificate matching "
                      "access.shard whose CN is the shard's id)")
        .with_code(rpc::kPermissionDenied);
  }
  return shard;
}

Status check_machine_identity(const rpc::Peer& peer, const std::string& machine) {
  if (!peer.tls) return {};
  const auto& id = peer.identity;
  if (id.common_name == machine || std::find(id.dns.begin(), id.dns.end(), machine) != id.dns.end())
    return {};
  log_warn("refusing a machine call for another machine",
           {{"PEER", peer.address}, {"CERTIFICATE", id.subject}, {"MACHINE", machine}});
  return make_error("this session's certificate (" + id.subject + ") does not name machine '" +
                    machine + "'")
      .with_code(rpc::kPermissionDenied);
}

}  // namespace weft::cp
