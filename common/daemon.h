// The common tail of every weft daemon's main(): start the manager (state recovered,
// socket bound, READY sent), run its event loop, and turn failures into an exit code.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "common/log.h"
#include "common/result.h"

namespace weft {

// Raises the soft descriptor limit to the hard one: a daemon holding a session per
// machine or per task must not stop at the historical 1,024 (select() is not used).
inline void raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// The common head of every weft daemon's main(): the configuration file is read when it
// was named (-c) or exists at its default path, else the defaults apply. Errors are
// printed as "<ident>: <error>"; nothing means exit 2.
template <class Config, class Loader>
std::optional<Config> load_config_or_defaults(const std::string& ident, const std::string& path,
                                              bool named, Loader load) {
  raise_fd_limit();
  if (!named && ::access(path.c_str(), F_OK) != 0) return Config{};
  auto loaded = load(path);
  if (!loaded.ok()) {
    std::cerr << ident << ": " << loaded.error().str() << "\n";
    return std::nullopt;
  }
  return std::move(loaded).value();
}

template <class Manager>
int run_daemon(Result<std::unique_ptr<Manager>> created) {
  if (!created.ok()) {
    log_error(created.error().str());
    return 1;
  }
  if (auto s = (*created)->start(); !s.ok()) {
    log_error("cannot start: " + s.error().str());
    return 1;
  }
  if (auto s = (*created)->run(); !s.ok()) {
    log_error(s.error().str());
    return 1;
  }
  return 0;
}

}  // namespace weft
