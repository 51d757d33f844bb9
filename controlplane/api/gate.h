// Who is calling the control plane, and whether they may (docs/security.md): the one
// place every feature asks. A caller is identified from its session (access.h:
// identify_caller); a call's level (Access) is checked for it; job changes are checked
// against the entitlement's owners; a region's calls are checked against the roles'
// certificates (access.front_end, access.shard).
#pragma once

#include <string>

#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/api/access.h"
#include "controlplane/machines/broker.h"

namespace weft::cp {

class CpServer;

class Gate {
 public:
  // `server` gives the sockets' group (known once it listens); `broker` the owners.
  Gate(const AccessConfig& access, const std::string& socket_group, const CpServer& server,
       const Broker& broker)
      : access_(access), socket_group_(socket_group), server_(server), broker_(broker) {}

  Caller caller(const rpc::CallContext& c) const;
  // Whether `who` may make a call of this level (Access); kPermissionDenied, logged.
  Status permit(const Caller& who, int access, const std::string& method) const;
  // Job operations in entitlement `e`: its owners and admins (kPermissionDenied).
  Status may_change_jobs(const Caller& who, EntitlementId e) const;
  // Whether the caller is one of the region's front ends (a certificate matching
  // access.front_end, or an admin on this host's Unix socket); logs a refusal.
  bool front_end_call(const rpc::CallContext& c, const char* method) const;
  // The shard `p` names, if the caller may act for it (its certificate, or this host).
  Result<std::string> calling_shard(const nlohmann::json& p, const rpc::CallContext& c) const;

 private:
  const AccessConfig& access_;
  const std::string& socket_group_;
  const CpServer& server_;
  const Broker& broker_;
};

// A machine's daemons speak for their own machine only: over TLS the certificate must
// name `machine` (a SAN DNS entry or the CN); otherwise kPermissionDenied, logged. Unix
// and plaintext sessions (tests, insecure_listen) are not bound.
Status check_machine_identity(const rpc::Peer& peer, const std::string& machine);

}  // namespace weft::cp
