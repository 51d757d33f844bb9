#include "controlplane/region/prefix_watch.h"

#include "common/log.h"

namespace weft::cp {

Result<std::unique_ptr<PrefixWatch>> PrefixWatch::create(EventLoop& loop, etcd::Config cfg,
                                                         std::string prefix,
                                                         std::function<void()> changed) {
  std::unique_ptr<PrefixWatch> w(new PrefixWatch(loop, std::move(prefix), std::move(changed)));
  TRY_ASSIGN(w->worker_, EtcdWorker::create(loop, std::move(cfg)));
  return w;
}

void PrefixWatch::after(int64_t revision) {
  revision_ = std::max(revision_, revision);
  if (!waiting_) wait();
}

void PrefixWatch::wait() {
  waiting_ = true;
  worker_->post([this, prefix = prefix_, from = revision_](etcd::Client& c) -> EtcdWorker::Then {
    auto r = c.wait_changed(prefix, from, 5'000);
    return [this, r = std::move(r)] {
      waiting_ = false;
      if (!r.ok()) {  // etcd away: again in a second (the reader's own rounds go on)
        auto t = loop_.add_timer_in(1'000'000, [this] {
          if (!waiting_) wait();
        });
        if (t.ok()) retry_ = std::move(t).value();
        return;
      }
      if (*r)
        changed_();  // the reader reads again and says after() with what it saw
      else
        wait();  // nothing within the wait: again, from the same revision
    };
  });
}

}  // namespace weft::cp
