// The common tail of every weft daemon's main(): start the manager (state recovered,
// socket bound, READY sent), run its event loop, and turn failures into an exit code.
#pragma once

#include <memory>
#include <string>

#include "common/log.h"
#include "common/result.h"

namespace weft {

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
