#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/result.h"
#include "controlplane/region/etcd_worker.h"

namespace weft::cp {

// A watch of everything under an etcd prefix, for a reader on an event loop: told the
// revision its last read saw (after()), it waits on a thread of its own (a Watch
// stream, up to 5 s at a time, then again) and calls `changed` on the loop once anything
// under the prefix changed since; the reader reads again and says after() again. One
// wait at a time; a failed one is tried again a second later.
class PrefixWatch {
 public:
  static Result<std::unique_ptr<PrefixWatch>> create(EventLoop& loop, etcd::Config cfg,
                                                     std::string prefix,
                                                     std::function<void()> changed);
  void after(int64_t revision);

 private:
  PrefixWatch(EventLoop& loop, std::string prefix, std::function<void()> changed)
      : loop_(loop), prefix_(std::move(prefix)), changed_(std::move(changed)) {}
  void wait();
  EventLoop& loop_;
  std::string prefix_;
  std::function<void()> changed_;
  std::unique_ptr<EtcdWorker> worker_;
  int64_t revision_ = 0;
  bool waiting_ = false;
  Source retry_;
};

}  // namespace weft::cp
