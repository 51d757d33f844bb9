// Who may do what on the control plane (docs/security.md). A caller is one of:
//  - a Unix-socket peer that is root, the daemon's user or in the weft group: admin;
//  - a TLS peer: its verified certificate is matched against the [access] patterns of
//    controlplane.toml; the highest role matched wins, and a certificate matching the
//    `machine` patterns may speak for the machine its SAN DNS entry (or CN) names;
//  - a plaintext TCP peer (loopback tests, insecure_listen): machine calls only.
// Roles: viewer (ls/show, secrets hidden), operator (jobs in the entitlements it owns),
// admin (everything: entitlements, machines, drains, any job).
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/result.h"
#include "common/rpc/session.h"
#include "common/tls.h"

namespace weft::cp {

enum class Role { kNone, kViewer, kOperator, kAdmin };
const char* role_name(Role r);

// A pattern naming certificates: "CN=<name>", "OU=<unit>", "O=<organisation>",
// "DNS=<SAN entry>", or a whole subject as OpenSSL prints it in RFC 2253 order
// ("CN=bob,OU=team-web,O=example"). Also used for an entitlement's owners.
Status check_principal_pattern(const std::string& pattern);
bool principal_matches(const std::string& pattern, const tls::Identity& id);
bool any_matches(const std::vector<std::string>& patterns, const tls::Identity& id);

struct AccessConfig {
  std::vector<std::string> machine{"OU=machine"};
  std::vector<std::string> viewer{"OU=viewer"};
  std::vector<std::string> op{"OU=operator"};
  std::vector<std::string> admin{"OU=admin"};
  // Who may read every task's logs besides admins and each entitlement's owners (none by
  // default: logs can hold secrets, so the viewer role is not enough).
  std::vector<std::string> logs;
  // A region's front ends (docs/regions.md): they may carry an operator's call to a
  // shard (frontend.forward), which then acts with the operator's role and identity.
  std::vector<std::string> front_end{"OU=frontend"};
  // A region's shards: they may borrow and give back machines at a broker (pool.lend,
  // pool.return) for the shard their certificate's CN names.
  std::vector<std::string> shard{"OU=shard"};

  Role role_of(const tls::Identity& id) const;
  bool is_machine(const tls::Identity& id) const { return any_matches(machine, id); }
  bool is_front_end(const tls::Identity& id) const { return any_matches(front_end, id); }
  bool is_shard(const tls::Identity& id) const { return any_matches(shard, id); }
};

// The [access] table of controlplane.toml (absent keys keep their defaults).
Result<AccessConfig> parse_access(const TomlDoc& doc, const toml::table* t);

// Who called, for permission checks and the audit log.
struct Caller {
  Role role = Role::kNone;
  bool machine = false;               // may make machine calls (for the machine it names)
  bool unix_socket = false;           // local: root or the weft group
  std::string who;                    // certificate subject, "uid 0 (pid 12)", or the address
  const tls::Identity* id = nullptr;  // TLS callers
};

// What each method needs (the level a feature registers a call with: calls.h Calls::add;
// a front end's own table in region/front_end.cc).
enum Access : int {
  kMachineCall = 1,  // a machine's daemons: Unix, plaintext TCP, or a machine certificate
  kViewerCall,       // ls/show: viewer or above
  kOperatorCall,     // job changes: operator or above (and an owner of the entitlement)
  kAdminCall,        // entitlements, machines, drains: admin
};

// Who `peer` is under `access`: a privileged Unix peer (root, the daemon's user, group
// `gid`) is an admin, a TLS peer has its certificate's role, a plaintext TCP peer may
// make machine calls only. A call a front end carried (peer.via) has the operator's role
// and identity as the front end verified them.
Caller identify_caller(const rpc::Peer& peer, const AccessConfig& access, int gid,
                       const std::string& group);
// Whether `who` may make a call of level `access` (Access); kPermissionDenied saying why,
// logged.
Status permit_call(const Caller& who, int access, const std::string& method,
                   const std::string& group);
Role parse_role(const std::string& name);  // kNone for anything else

// Whether `c` may change jobs of an entitlement owned by `owners`: admins always,
// operators whose certificate matches an owner pattern.
bool may_operate(const Caller& c, const std::vector<std::string>& owners);

}  // namespace weft::cp
