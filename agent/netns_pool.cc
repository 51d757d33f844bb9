#include "agent/netns_pool.h"

#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace weft::agent {

namespace {

// A new network namespace with its loopback up: its descriptor. The calling thread goes
// back to `home` (its own namespace) before it returns: no thread of the agent stays in
// a namespace a task gets.
Result<Fd> make_netns(int home) {
  if (::unshare(CLONE_NEWNET) < 0) return sys_error("unshare(CLONE_NEWNET)");
  Fd ns(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return sys_error("open /proc/thread-self/ns/net");
  struct Home {
    int fd;
    ~Home() { (void)::setns(fd, CLONE_NEWNET); }
  } back{home};
  Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return sys_error("socket");
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof ifr);
  std::strcpy(ifr.ifr_name, "lo");
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) < 0) return sys_error("get lo flags");
  ifr.ifr_flags |= IFF_UP;
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) < 0) return sys_error("bring lo up");
  return ns;
}

}  // namespace

Result<Fd> make_netns() {
  Fd home(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!home.valid()) return sys_error("open /proc/thread-self/ns/net");
  return make_netns(home.get());
}

NetnsPool::NetnsPool(size_t size) : size_(size) {
  if (size_ == 0) return;
  // The thread takes no signal: the agent's loop reads them from a signalfd, and a
  // SIGTERM delivered to a thread that did not block it would kill the agent outright.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] { run(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

NetnsPool::~NetnsPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Fd NetnsPool::take() {
  Fd out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (ready_.empty()) return out;
    out = std::move(ready_.front());
    ready_.pop_front();
  }
  wake_.notify_one();
  return out;
}

size_t NetnsPool::ready() {
  std::lock_guard<std::mutex> l(mu_);
  return ready_.size();
}

std::string NetnsPool::failure() {
  std::lock_guard<std::mutex> l(mu_);
  return failure_;
}

void NetnsPool::run() {
  Fd home(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      wake_.wait(l, [this] { return stop_ || ready_.size() < size_; });
      if (stop_) return;
    }
    auto ns = home.valid() ? make_netns(home.get())
                           : Result<Fd>(sys_error("open /proc/thread-self/ns/net"));
    std::lock_guard<std::mutex> l(mu_);
    if (!ns.ok()) {
      failure_ = ns.error().str();  // starts make their own from now on
      return;
    }
    ready_.push_back(std::move(*ns));
  }
}

}  // namespace weft::agent
