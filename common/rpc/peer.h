// Who is at the other end of a session (Peer: its socket's credentials, its verified
// certificate, the operator a front end carried the call for), and the local-socket
// access rule every weft daemon applies to it (require_privileged).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/result.h"
#include "common/tls.h"

namespace weft::rpc {

struct Peer {
  bool is_unix = false;
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  // Supplementary groups of the peer when it connected (SO_PEERGROUPS): taken from the
  // socket, not from /proc/<pid>, so a pid reused after the peer exited cannot lend
  // its groups.
  std::vector<gid_t> groups;
  std::string address;  // "unix" or "ip:port"
  std::string host;     // TCP: the source address without the port
  // TLS sessions: the peer's certificate verified against the CA bundle (and CRL), and
  // who it says the peer is. Set once the handshake is done.
  bool tls = false;
  tls::Identity identity;
  // A call a region's front end carried for an operator (docs/regions.md): the front
  // end as the callee knows it, and the operator's role as the front end found it;
  // `identity` (with `tls`) or `address` is then the operator's.
  std::string via;
  std::string via_role;
};

// The local-socket access rule of every weft daemon: a Unix peer that is root, the
// daemon's own user, or a member (primary or supplementary, from the socket's
// SO_PEERGROUPS) of `gid`. Errors carry kPermissionDenied and say what `action` needed.
Status require_privileged(const Peer& peer, int gid, const std::string& group_name,
                          const std::string& action);

}  // namespace weft::rpc
