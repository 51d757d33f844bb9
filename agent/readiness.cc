#include "agent/readiness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

namespace weft::agent {

namespace {

std::string timed_out(uint64_t us) {
  return "timed out after " + std::to_string(us / 1000) + "ms";
}

// One-shot delivery: the callback runs at most once, and never after the run is gone.
class Once {
 public:
  explicit Once(CheckDone d) : done_(std::move(d)) {}
  void operator()(bool ok, std::string why) {
    if (auto d = std::exchange(done_, nullptr)) d(ok, std::move(why));
  }

 private:
  CheckDone done_;
};

class TcpRun : public CheckRun {
 public:
  TcpRun(EventLoop& loop, const ReadinessCheck& c, const CheckTarget& t, CheckDone done)
      : done_(std::move(done)) {
    sock_ = Fd(socket_in_netns(t.own_network ? t.pidfd : -1, AF_INET,
                               SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock_.valid()) {
      fail_soon(loop, std::string("socket: ") + std::strerror(errno));
      return;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(c.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(sock_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 &&
        errno != EINPROGRESS) {
      fail_soon(loop, std::strerror(errno));
      return;
    }
    auto io = loop.add_io(sock_.get(), EPOLLOUT, [this](uint32_t) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(sock_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      finish(err == 0, err == 0 ? "" : std::strerror(err));
    });
    auto timer = loop.add_timer_in(c.timeout_us,
                                   [this, us = c.timeout_us] { finish(false, timed_out(us)); });
    if (!io.ok() || !timer.ok()) {
      fail_soon(loop, "cannot watch the connection");
      return;
    }
    io_ = std::move(io).value();
    timer_ = std::move(timer).value();
  }

 private:
  void fail_soon(EventLoop& loop, std::string why) {
    auto d = loop.add_defer([this, why] { finish(false, why); });
    if (d.ok()) timer_ = std::move(d).value();
  }
  void finish(bool ok, std::string why) {
    io_.reset();
    sock_.reset();
    Once done = std::move(done_);
    timer_.reset();  // may be the source running this: nothing of `this` is used after
    done(ok, std::move(why));
  }
  Once done_;
  Fd sock_;
  Source io_, timer_;
};

class HttpRun : public CheckRun {
 public:
  HttpRun(EventLoop& loop, HttpClient& http, const ReadinessCheck& c, const CheckTarget& t,
          CheckDone done)
      : http_(http) {
    HttpRequest req;
    req.url = "http://127.0.0.1:" + std::to_string(c.port) + c.path;
    req.timeout_us = c.timeout_us;
    req.max_body = 0;
    if (t.own_network) {
      int pidfd = t.pidfd;
      req.open_socket = [pidfd](int family, int type, int protocol) {
        return socket_in_netns(pidfd, family, type, protocol);
      };
    }
    auto shared = std::make_shared<Once>(std::move(done));
    auto id = http.get(std::move(req), [shared](Result<HttpResponse> r) {
      if (!r.ok()) return (*shared)(false, r.error().message);
      bool ok = r->status >= 200 && r->status < 400;
      (*shared)(ok, ok ? "" : "HTTP " + std::to_string(r->status));
    });
    if (id.ok()) {
      id_ = *id;
    } else {
      auto d = loop.add_defer([shared, why = id.error().message] { (*shared)(false, why); });
      if (d.ok()) defer_ = std::move(d).value();
    }
  }
  ~HttpRun() override {
    if (id_) http_.cancel(id_);
  }

 private:
  HttpClient& http_;
  uint64_t id_ = 0;
  Source defer_;
};

class ExecRun : public CheckRun {
 public:
  ExecRun(EventLoop& loop, Reaper& reaper, const ReadinessCheck& c, const CheckTarget& t,
          CheckDone done)
      : reaper_(reaper), done_(std::move(done)) {
    auto spawned = spawn_init(join_request(t.init_path, t.cgroup_dir, t.pidfd, t.join_argv));
    if (!spawned.ok()) {
      auto d = loop.add_defer([this, why = spawned.error().message] { finish(false, why); });
      if (d.ok()) timer_ = std::move(d).value();
      return;
    }
    pidfd_ = std::move(spawned->pidfd);
    auto io = loop.add_io(pidfd_.get(), EPOLLIN, [this](uint32_t) {
      siginfo_t info{};
      if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                   WEXITED | WNOHANG) < 0 ||
          info.si_pid == 0)
        return;
      pidfd_.reset();
      if (info.si_code == CLD_EXITED && info.si_status == 0) return finish(true, "");
      if (info.si_code == CLD_EXITED && info.si_status == 125)
        return finish(false, "cannot enter the task (it is ending?)");
      if (info.si_code == CLD_EXITED && info.si_status == 126)
        return finish(false, "cannot take the task's identity or confinement");
      if (info.si_code == CLD_EXITED && info.si_status == 127)
        return finish(false, "cannot execute the command");
      if (info.si_code == CLD_EXITED)
        return finish(false, "exit status " + std::to_string(info.si_status));
      finish(false, "killed by signal " + std::to_string(info.si_status));
    });
    auto timer = loop.add_timer_in(c.timeout_us, [this, us = c.timeout_us] {
      kill_and_reap();
      finish(false, timed_out(us));
    });
    if (io.ok()) io_ = std::move(io).value();
    if (timer.ok()) timer_ = std::move(timer).value();
  }
  ~ExecRun() override { kill_and_reap(); }

 private:
  void kill_and_reap() {
    io_.reset();
    if (!pidfd_.valid()) return;
    (void)signal_pidfd(pidfd_.get(), SIGKILL);
    reaper_.adopt(std::move(pidfd_));
  }
  void finish(bool ok, std::string why) {
    io_.reset();
    Once done = std::move(done_);
    timer_.reset();
    done(ok, std::move(why));
  }
  Reaper& reaper_;
  Once done_;
  Fd pidfd_;
  Source io_, timer_;
};

}  // namespace

void Reaper::adopt(Fd pidfd) {
  int fd = pidfd.get();
  auto reap = [fd] {
    siginfo_t info{};
    return ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(fd), &info,
                    WEXITED | WNOHANG) < 0 ||
           info.si_pid != 0;
  };
  if (reap()) return;  // already gone (or not our child any more)
  auto io = loop_.add_io(fd, EPOLLIN, [this, fd, reap](uint32_t) {
    if (reap()) orphans_.erase(fd);
  });
  if (!io.ok()) return;  // leaks a zombie until the agent exits; logged by the caller
  orphans_[fd] = {std::move(pidfd), std::move(io).value()};
}

int socket_in_netns(int pidfd, int family, int type, int protocol) {
  if (pidfd < 0) return ::socket(family, type, protocol);
  // setns changes the calling thread only: a thread of its own enters the namespace,
  // makes the socket (which stays in that namespace) and ends.
  int fd = -1, err = 0;
  std::thread t([&] {
    if (::setns(pidfd, CLONE_NEWNET) < 0) {
      err = errno;
      return;
    }
    fd = ::socket(family, type, protocol);
    if (fd < 0) err = errno;
  });
  t.join();
  if (fd < 0) errno = err;
  return fd;
}

std::unique_ptr<CheckRun> start_check(EventLoop& loop, HttpClient& http, Reaper& reaper,
                                      const ReadinessCheck& c, const CheckTarget& target,
                                      CheckDone done) {
  switch (c.kind) {
    case ReadinessKind::kTcp:
      return std::make_unique<TcpRun>(loop, c, target, std::move(done));
    case ReadinessKind::kHttp:
      return std::make_unique<HttpRun>(loop, http, c, target, std::move(done));
    case ReadinessKind::kExec:
      return std::make_unique<ExecRun>(loop, reaper, c, target, std::move(done));
  }
  return nullptr;
}

}  // namespace weft::agent
