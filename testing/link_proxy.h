// A link a test can cut, for partitions without root (controlplane/region/region_test.cc's
// chaos): a forwarder on a thread of its own between where a client connects (a loopback
// TCP port, or a Unix socket path) and where the real server listens. hold() stops it
// carrying bytes one way or both, as a partition does: nothing is lost or reordered —
// what is sent meanwhile waits (in the proxy and the kernel's buffers, until the sender
// blocks) and goes on at heal(), as TCP retransmits after a partition heals; a peer that
// gives up meanwhile (its own timeout) is seen to have closed only after the heal, as a
// FIN that could not cross. A connect made while the link is held is accepted and then
// carries nothing, as a connect that waits on its SYN. A server that goes away (killed)
// closes its side, and the client's with it.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weft::testing {

class LinkProxy {
 public:
  enum class Held { kNone, kBoth, kToServer, kFromServer };

  // Listens on a loopback port of its own, forwarding to host:port.
  static std::unique_ptr<LinkProxy> tcp(const std::string& host, uint16_t port) {
    auto p = std::unique_ptr<LinkProxy>(new LinkProxy);
    p->target_host_ = host;
    p->target_port_ = port;
    p->listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (p->listener_ < 0 || ::bind(p->listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(p->listener_, 64) != 0 ||
        ::getsockname(p->listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return nullptr;
    p->endpoint_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    p->start();
    return p;
  }
  // Listens on the Unix socket `path`, forwarding to the Unix socket `target`.
  static std::unique_ptr<LinkProxy> unix_socket(const std::string& path,
                                                const std::string& target) {
    auto p = std::unique_ptr<LinkProxy>(new LinkProxy);
    p->target_path_ = target;
    p->listen_path_ = path;
    ::unlink(path.c_str());
    p->listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    if (path.size() >= sizeof a.sun_path) return nullptr;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    if (p->listener_ < 0 || ::bind(p->listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(p->listener_, 64) != 0)
      return nullptr;
    p->endpoint_ = path;
    p->start();
    return p;
  }
  LinkProxy(const LinkProxy&) = delete;
  LinkProxy& operator=(const LinkProxy&) = delete;
  ~LinkProxy() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (auto& c : conns_) c.close_both();
    if (listener_ >= 0) ::close(listener_);
    if (wake_ >= 0) ::close(wake_);
    if (!listen_path_.empty()) ::unlink(listen_path_.c_str());
  }

  // Where clients connect: "127.0.0.1:PORT" or the socket's path.
  const std::string& endpoint() const { return endpoint_; }
  // In effect when it returns: the thread has begun a round with it (nothing it carries
  // from then on crosses a held way).
  void hold(Held h) {
    held_ = h;
    const uint64_t g = ++gen_;
    uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
    while (seen_.load() < g && !stopped_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void heal() { hold(Held::kNone); }
  Held held() const { return held_; }

 private:
  LinkProxy() = default;
  static constexpr size_t kBuffer = 1 << 16;
  struct Side {
    int fd = -1;
    std::string out;   // read from the other side, still to write here
    bool eof = false;  // the other side closed: shut this one's writing once `out` is out
  };
  struct Conn {
    Side client, server;
    void close_both() {
      for (Side* s : {&client, &server})
        if (s->fd >= 0) {
          ::close(s->fd);
          s->fd = -1;
        }
    }
    bool done() const { return client.fd < 0 && server.fd < 0; }
  };

  void start() {
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    thread_ = std::thread([this] {
      loop();
      stopped_ = true;
    });
  }
  int connect_server() const {
    int fd = -1;
    if (!target_path_.empty()) {
      fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::snprintf(a.sun_path, sizeof a.sun_path, "%s", target_path_.c_str());
      if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
      }
    } else {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(target_port_);
      ::inet_pton(AF_INET, target_host_.c_str(), &a.sin_addr);
      if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
      }
    }
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
  }
  // Bytes from `from` to `to`'s buffer (when there is room), and `to`'s buffer out.
  static void pump(Side& from, Side& to) {
    if (from.fd >= 0 && !to.eof && to.out.size() < kBuffer) {
      char buf[16384];
      ssize_t n = ::read(from.fd, buf, sizeof buf);
      if (n > 0) {
        to.out.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        to.eof = true;  // closed (or broken): passed on once what it sent is out
      }
    }
    if (to.fd >= 0 && !to.out.empty()) {
      ssize_t n = ::send(to.fd, to.out.data(), to.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        to.out.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        to.out.clear();
        to.eof = true;
        from.eof = true;
      }
    }
  }
  void loop() {
    while (!stop_) {
      const uint64_t g = gen_.load();
      const Held h = held_;
      seen_ = g;
      const bool up = h != Held::kToServer && h != Held::kBoth;      // client -> server flows
      const bool down = h != Held::kFromServer && h != Held::kBoth;  // server -> client flows
      std::vector<pollfd> fds{{listener_, POLLIN, 0}, {wake_, POLLIN, 0}};
      for (auto& c : conns_) {
        // A held direction is not looked at (its hang-ups neither: they cross at the heal).
        short cl = 0, sv = 0;
        if (up) {
          if (!c.server.eof && c.server.out.size() < kBuffer) cl |= POLLIN;
          if (!c.server.out.empty()) sv |= POLLOUT;
        }
        if (down) {
          if (!c.client.eof && c.client.out.size() < kBuffer) sv |= POLLIN;
          if (!c.client.out.empty()) cl |= POLLOUT;
        }
        fds.push_back({cl || (up && down) ? c.client.fd : -1, cl, 0});
        fds.push_back({sv || (up && down) ? c.server.fd : -1, sv, 0});
      }
      if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) return;
      if (fds[0].revents & POLLIN)
        for (;;) {
          int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (c < 0) break;
          int s = connect_server();
          if (s < 0) {
            ::close(c);  // nothing listens there now: refused, as a connect to it is
            continue;
          }
          Conn conn;
          conn.client.fd = c;
          conn.server.fd = s;
          conns_.push_back(std::move(conn));
        }
      if (fds[1].revents & POLLIN) {
        uint64_t n;
        (void)!::read(wake_, &n, sizeof n);
      }
      size_t i = 2;
      for (auto& c : conns_) {
        const short cr = i < fds.size() ? fds[i].revents : 0;
        const short sr = i + 1 < fds.size() ? fds[i + 1].revents : 0;
        i += 2;
        if (up && (cr & (POLLIN | POLLHUP | POLLERR) || sr & POLLOUT)) pump(c.client, c.server);
        if (down && (sr & (POLLIN | POLLHUP | POLLERR) || cr & POLLOUT)) pump(c.server, c.client);
        // A side whose peer closed and whose bytes are all out closes, and then the other
        // side once its bytes are out (no half-closed links: the protocols here are calls).
        for (auto [side, other] :
             {std::pair{&c.client, &c.server}, std::pair{&c.server, &c.client}})
          if (side->eof && side->out.empty() && side->fd >= 0) {
            ::close(side->fd);
            side->fd = -1;
            other->eof = true;
          }
      }
      conns_.remove_if([](const Conn& c) { return c.done(); });
    }
  }

  int listener_ = -1;
  std::string endpoint_, listen_path_, target_path_, target_host_;
  uint16_t target_port_ = 0;
  std::atomic<Held> held_{Held::kNone};
  std::atomic<bool> stop_{false}, stopped_{false};
  std::atomic<uint64_t> gen_{0}, seen_{0};
  int wake_ = -1;
  std::list<Conn> conns_;  // the thread's
  std::thread thread_;
};

}  // namespace weft::testing
