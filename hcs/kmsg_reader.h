// The kernel log as it grows (/dev/kmsg, non-blocking, read on the event loop): each new
// record goes to the kernel-log probe, and to the OOM probe, which also counts the OOM
// kills the kernel logs. The last sequence number read is kept in hcs.db's meta table, so
// the records read before a restart are not news after it; records carry monotonic time
// since boot and are placed at their real age, so the backlog read at start does not look
// like a burst happening now.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/fs.h"
#include "common/store.h"
#include "hcs/kernel_probes.h"

namespace weft::hcs {

class KmsgReader {
 public:
  // A kernel event younger than a minute was read: the verdict may change now, not at the
  // next cycle. `now_us` is wall time, as the probes' samples are.
  using Fresh = std::function<void(uint64_t now_us)>;
  // Opens the kernel log under `host_root` ("/" on a machine, a fake tree in tests). One
  // that cannot be opened is said in the journal and leaves the probe unknown: not an error.
  static Result<std::unique_ptr<KmsgReader>> open(EventLoop& loop, Db& db,
                                                  const std::string& host_root, KmsgProbe& probe,
                                                  OomProbe* oom, Fresh fresh);

 private:
  KmsgReader(Db& db, KmsgProbe& probe, OomProbe* oom, Fresh fresh)
      : db_(db), probe_(probe), oom_(oom), fresh_(std::move(fresh)) {}
  void read();

  Db& db_;
  KmsgProbe& probe_;
  OomProbe* oom_;
  Fresh fresh_;
  Fd fd_;
  Source src_;
  uint64_t last_seq_ = 0;
};

}  // namespace weft::hcs
