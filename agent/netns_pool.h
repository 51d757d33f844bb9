// Network namespaces made ahead of time, so that a task's start does not wait for one.
//
// Making a network namespace is the dearest part of a task's clone (~0.7 ms here, and
// tens of milliseconds while the kernel is still tearing down old ones under RCU). A
// thread of the agent's own makes them: unshare(CLONE_NEWNET) moves only that thread,
// which opens /proc/thread-self/ns/net, brings the loopback up and keeps the descriptor
// in a small queue. spawn_init() hands one to the task's child, which setns()es into it
// instead of cloning with CLONE_NEWNET. A namespace lives exactly as long as the
// descriptors and processes in it: nothing outlives an agent that dies, and a task's
// namespace is as fresh as one made at its start (never used before).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

#include "common/fs.h"

namespace weft::agent {

// A fresh namespace made by the calling thread, which stays in its own: what the pool
// does for each of its namespaces, for a caller that cannot wait for one.
Result<Fd> make_netns();

class NetnsPool {
 public:
  // Keeps up to `size` namespaces ready (0: none; take() then always returns none).
  explicit NetnsPool(size_t size);
  ~NetnsPool();
  NetnsPool(const NetnsPool&) = delete;
  NetnsPool& operator=(const NetnsPool&) = delete;

  // A fresh namespace (close-on-exec descriptor, loopback up), or an invalid Fd when none
  // is ready: the caller then makes its own. Never blocks.
  Fd take();
  // How many are ready now (metrics, tests).
  size_t ready();
  // Whether the thread stopped because the kernel refused it (no CAP_SYS_ADMIN, no
  // network namespaces): the reason, or empty.
  std::string failure();

 private:
  void run();

  const size_t size_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Fd> ready_;
  bool stop_ = false;
  std::string failure_;
  std::thread thread_;
};

}  // namespace weft::agent
