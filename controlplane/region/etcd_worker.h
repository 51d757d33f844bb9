#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/event.h"
#include "common/fs.h"
#include "common/result.h"
#include "controlplane/store/etcd_client.h"

namespace weft::cp {

// One thread that makes etcd calls for an event loop: post() queues work that runs on
// the thread with its own client; what the work returns runs on the loop afterwards, in
// order. Nothing on the loop waits for etcd. Destroying the worker drops work not begun
// and waits for the call under way (bounded by the client's timeout).
class EtcdWorker {
 public:
  using Then = std::function<void()>;
  using Work = std::function<Then(etcd::Client&)>;
  static Result<std::unique_ptr<EtcdWorker>> create(EventLoop& loop, etcd::Config cfg);
  ~EtcdWorker();
  EtcdWorker(const EtcdWorker&) = delete;
  EtcdWorker& operator=(const EtcdWorker&) = delete;
  void post(Work w);
  size_t queued() const;
  // Ends the client's watch in progress, if any (from the loop).
  void cancel_waits() { client_->cancel_waits(); }

 private:
  EtcdWorker() = default;
  void run();
  void deliver();
  std::unique_ptr<etcd::Client> client_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> work_;
  std::deque<Then> done_;
  bool stop_ = false;
  Fd efd_;
  Source wake_;
  std::thread thread_;
};

}  // namespace weft::cp
