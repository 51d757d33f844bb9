// weft-controlplane's dispatcher with all its methods, as a peer on its socket reaches
// it: the harness runs as root, so operator calls mutate (entitlements, jobs, drains)
// and machine calls register and report. Nothing may crash or throw into the loop.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "controlplane/daemon/manager.h"

using namespace weft;

namespace {

struct Plane {
  cp::Manager* manager = nullptr;
  std::string dir, socket;
};

// One control plane for the whole run (its state grows with what the inputs create).
Plane& plane() {
  static Plane p = [] {
    log_set_level(LogLevel::kError);
    Plane x;
    x.dir = std::filesystem::temp_directory_path() / ("weft-fuzz-cp-" + random_hex(6));
    (void)mkdir_p(x.dir);
    cp::CpConfig cfg;
    x.socket = cfg.socket = x.dir + "/cp.sock";
    cfg.state_dir = x.dir + "/state";
    cfg.listen = "";
    auto created = cp::Manager::create(cfg);
    if (!created.ok() || !(*created)->start().ok()) std::abort();
    x.manager = std::move(created).value().release();
    return x;
  }();
  static bool cleanup = [] {
    std::atexit([] { (void)remove_tree(plane().dir); });
    return true;
  }();
  (void)cleanup;
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cp::Manager* m = plane().manager;
  const std::string& sock = plane().socket;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0) std::abort();
  size_t off = 0;
  char sink[65536];
  for (int round = 0; round < 64 && off < size; ++round) {
    ssize_t n = ::write(fd, data + off, size - off);
    if (n > 0) off += static_cast<size_t>(n);
    (void)m->loop().run_once(0);
    while (::read(fd, sink, sizeof sink) > 0) {
    }
  }
  (void)!::write(fd, "\n", 1);
  for (int i = 0; i < 4; ++i) {
    (void)m->loop().run_once(0);
    while (::read(fd, sink, sizeof sink) > 0) {
    }
  }
  ::close(fd);
  (void)m->loop().run_once(0);  // the session's close
  return 0;
}
