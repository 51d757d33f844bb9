// Whether a local peer may make a privileged call (peer.h).
#include "common/rpc/client.h"
#include "common/rpc/server.h"

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/resource.h>

#include <cstring>
#include <thread>
#include <utility>

#include <simdjson.h>

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc/detail.h"

namespace weft::rpc {

using namespace detail;

// ---- Access ----

Status require_privileged(const Peer& peer, int gid, const std::string& group_name,
                          const std::string& action) {
  if (!peer.is_unix) return make_error("permission denied").with_code(kPermissionDenied);
  if (peer.uid == 0 || peer.uid == ::getuid()) return {};
  if (gid >= 0) {
    if (peer.gid == static_cast<gid_t>(gid)) return {};
    for (gid_t g : peer.groups)
      if (g == static_cast<gid_t>(gid)) return {};
  }
  return make_error("permission denied: " + action + " needs root or membership in group '" +
                    group_name + "'")
      .with_code(kPermissionDenied);
}

}  // namespace weft::rpc
