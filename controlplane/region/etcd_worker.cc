#include "controlplane/region/etcd_worker.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"

namespace weft::cp {

Result<std::unique_ptr<EtcdWorker>> EtcdWorker::create(EventLoop& loop, etcd::Config cfg) {
  std::unique_ptr<EtcdWorker> w(new EtcdWorker());
  TRY_ASSIGN(w->client_, etcd::Client::create(std::move(cfg)));
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return sys_error("eventfd");
  w->efd_ = Fd(fd);
  EtcdWorker* self = w.get();
  TRY_ASSIGN(w->wake_, loop.add_io(fd, EPOLLIN, [self](uint32_t) { self->deliver(); }));
  w->thread_ = std::thread([self] { self->run(); });
  return w;
}

EtcdWorker::~EtcdWorker() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    work_.clear();
  }
  cv_.notify_all();
  client_->cancel_waits();  // a watch under way ends now, not at its timeout
  if (thread_.joinable()) thread_.join();
}

void EtcdWorker::post(Work w) {
  {
    std::lock_guard<std::mutex> g(mu_);
    work_.push_back(std::move(w));
  }
  cv_.notify_all();
}

size_t EtcdWorker::queued() const {
  std::lock_guard<std::mutex> g(mu_);
  return work_.size();
}

void EtcdWorker::run() {
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [this] { return stop_ || !work_.empty(); });
      if (stop_) return;
      w = std::move(work_.front());
      work_.pop_front();
    }
    Then then = w(*client_);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (then) done_.push_back(std::move(then));
    }
    uint64_t one = 1;
    (void)!::write(efd_.get(), &one, sizeof one);
  }
}

void EtcdWorker::deliver() {
  uint64_t n;
  while (::read(efd_.get(), &n, sizeof n) > 0) {
  }
  std::deque<Then> got;
  {
    std::lock_guard<std::mutex> g(mu_);
    got.swap(done_);
  }
  for (auto& then : got) then();
}

}  // namespace weft::cp
