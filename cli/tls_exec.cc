// weftctl's side of tls_helper.h: no TLS here; weftctl-tls is executed in its place.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cli/tls_helper.h"
#include "common/fs.h"

namespace weft::cli {
namespace {
char** command_line = nullptr;
}

void remember_command_line(int /*argc*/, char** argv) {
  command_line = argv;
}

Result<rpc::ClientTls> client_tls(const tls::Config& /*config*/,
                                  const std::string& /*server_name*/) {
  std::vector<std::string> candidates;
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0)
    candidates.push_back(dirname_of(std::string(self, static_cast<size_t>(n))) + "/weftctl-tls");
  candidates.push_back(WEFT_TLS_HELPER_PATH);
  if (!command_line) return make_error("weftctl's command line was not kept");
  std::string tried;
  for (const auto& path : candidates) {
    if (::access(path.c_str(), X_OK) != 0) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    if (::setenv("WEFTCTL_BUILD_ID", WEFT_BUILD_ID, 1) != 0) return sys_error("setenv");
    ::execv(path.c_str(), command_line);
    return sys_error("cannot run weftctl's TLS helper " + path);
  }
  return make_error("weftctl's TLS helper (weftctl-tls) is not installed; looked at " + tried);
}

Status check_tls_helper_build() {
  return {};
}

}  // namespace weft::cli
