// Who a task's main process runs as: a user and group resolved on the host or in the
// task's image, under the machine's policy (docs/configuration.md, [tasks]).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/result.h"

namespace weft::agent {

// The resolved identity of a task's main process.
struct Identity {
  long uid = -1, gid = -1;
  std::vector<gid_t> groups;
  bool set = false;
};
Result<Identity> resolve_identity(const std::string& user, const std::string& group);

// The identity a task runs as under the machine's policy: the spec's user, else
// `default_user`; uid 0 or gid 0 (primary or supplementary) only when `allow_root`.
// Errors name the spec field.
// With `image_roots` (the image's layer directories, top-most first), names resolve in
// the image's /etc/passwd and /etc/group, and `user` may be OCI's "user[:group]".
Result<Identity> task_identity(const std::string& user, const std::string& group,
                               const std::string& default_user, bool allow_root,
                               const std::vector<std::string>* image_roots = nullptr);
Result<Identity> resolve_identity_in_image(const std::string& user, const std::string& group,
                                           const std::vector<std::string>& roots_top_first);

}  // namespace weft::agent
