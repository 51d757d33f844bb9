// A non-blocking connect with its name resolution off the loop and a timeout (client.h).
#include "common/rpc/client.h"
#include "common/rpc/server.h"

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/resource.h>

#include <cstring>
#include <thread>
#include <utility>

#include <simdjson.h>

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc/detail.h"

namespace weft::rpc {

using namespace detail;

// ---- ConnectAttempt ----

struct ConnectAttempt::Resolve {
  Fd wake_r, wake_w;  // the thread writes one byte when `result` is set
  std::optional<Result<std::vector<std::vector<char>>>> result;
};

std::unique_ptr<ConnectAttempt> ConnectAttempt::start(EventLoop& loop, const Endpoint& ep,
                                                      uint64_t timeout_us, Done done) {
  std::unique_ptr<ConnectAttempt> a(new ConnectAttempt(loop, ep, std::move(done)));
  a->begin(timeout_us);
  return a;
}

ConnectAttempt::~ConnectAttempt() {
  io_.reset();
  timer_.reset();
  resolve_io_.reset();
  defer_.reset();
}

void ConnectAttempt::begin(uint64_t timeout_us) {
  auto t = loop_.add_timer_in(timeout_us, [this] {
    finish(make_error("connect to " + endpoint_name(ep_) + " timed out").with_code(kTimeout));
  });
  if (t.ok()) timer_ = std::move(t).value();
  if (ep_.is_unix) {
    auto a = unix_address(ep_.path);
    if (!a.ok()) return finish(std::move(a).error());
    addrs_.push_back(std::move(a).value());
  } else if (auto n = numeric_address(ep_.host, ep_.port)) {
    addrs_.push_back(std::move(*n));
  } else {
    // getaddrinfo blocks (DNS can take seconds): a helper thread does it.
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) return finish(sys_error("pipe"));
    resolve_ = std::make_shared<Resolve>();
    resolve_->wake_r.reset(p[0]);
    resolve_->wake_w.reset(p[1]);
    auto io = loop_.add_io(p[0], EPOLLIN, [this](uint32_t) { resolved(); });
    if (!io.ok()) return finish(std::move(io).error());
    resolve_io_ = std::move(io).value();
    try {
      std::thread([r = resolve_, host = ep_.host, port = ep_.port] {
        r->result = resolve_blocking(host, port);
        char one = 1;
        (void)!::write(r->wake_w.get(), &one, 1);
      }).detach();
    } catch (const std::system_error& e) {
      return finish(make_error(std::string("cannot start resolver thread: ") + e.what()));
    }
    return;
  }
  try_next();
}

void ConnectAttempt::resolved() {
  resolve_io_.reset();
  auto r = std::move(resolve_->result);
  resolve_.reset();
  if (!r || !r->ok()) return finish(r ? std::move(*r).error() : make_error("resolver failed"));
  addrs_ = std::move(**r);
  try_next();
}

void ConnectAttempt::try_next() {
  io_.reset();
  fd_.reset();
  while (next_ < addrs_.size()) {
    bool in_progress = false;
    auto fd = start_connect(addrs_[next_++], &in_progress);
    if (!fd.ok()) {
      last_ = std::move(fd).error().wrap("connect to " + endpoint_name(ep_));
      continue;
    }
    fd_ = std::move(fd).value();
    if (!in_progress) {
      // Connected at once (Unix sockets): report from the loop, not from start().
      auto d = loop_.add_defer([this] { finish(std::move(fd_)); });
      if (d.ok()) defer_ = std::move(d).value();
      return;
    }
    auto io = loop_.add_io(fd_.get(), EPOLLOUT, [this](uint32_t) { on_writable(); });
    if (!io.ok()) return finish(std::move(io).error());
    io_ = std::move(io).value();
    return;
  }
  finish(last_);
}

void ConnectAttempt::on_writable() {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == 0) return finish(std::move(fd_));
  last_ = errno_error(err, "connect to " + endpoint_name(ep_));
  try_next();
}

void ConnectAttempt::finish(Result<Fd> r) {
  if (!done_) return;
  io_.reset();
  timer_.reset();
  resolve_io_.reset();
  auto done = std::move(done_);
  done_ = nullptr;
  done(std::move(r));  // may destroy this
}

}  // namespace weft::rpc
