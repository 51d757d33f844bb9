// service_load: the two ends of the "zero failed requests through a move" benchmark
// (issue 33, docs/benchmarks.md).
//
//   service_load serve [--port N]     an HTTP/1.1 server with keep-alive on N (default
//                                     $WEFT_PORT_HTTP) that shuts down the way careful
//                                     servers do on SIGTERM: it stops accepting, answers
//                                     the requests it has, closes idle connections, exits.
//                                     GET /metrics answers Prometheus text: the requests
//                                     served and service_in_flight, which is
//                                     $SERVICE_IN_FLIGHT (an app metric for autoscaling).
//   service_load load --name _http._tcp.web.e.weft. [--dns 127.0.0.1:8600] [--workers 16]
//                     [--per-connection 20]
//                                     a client as ordinary ones are: it resolves the SRV
//                                     name through weft's DNS for every new connection
//                                     (caching answers for their TTL, as a local resolver
//                                     does), keeps each connection for --per-connection
//                                     requests, and retries a request once on a new
//                                     connection when a reused one turns out closed before
//                                     any byte of the answer came (as curl and Go do).
//                                     Until SIGTERM or SIGINT; then one JSON line of totals:
//                                     requests, failures by kind, latency percentiles.
// DNS packets are made and read by ldns.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/ldns.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop = true;
}

uint64_t now_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// ---- serve ----

int serve(int port) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 512) != 0) {
    std::perror("service_load serve: listen");
    return 1;
  }
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = lfd;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::map<int, std::string> conns;  // fd -> bytes of a request not answered yet
  char host[64] = "";
  ::gethostname(host, sizeof host - 1);
  const std::string body = "served by " + std::string(host) + ":" + std::to_string(port) + "\n";
  std::fprintf(stderr, "service_load: serving on port %d\n", port);
  const char* env_in_flight = std::getenv("SERVICE_IN_FLIGHT");
  const std::string in_flight = env_in_flight ? env_in_flight : "0";
  uint64_t served = 0;
  bool draining = false;
  uint64_t drain_deadline = 0;
  for (;;) {
    if (g_stop && !draining) {
      // Careful shutdown: no new connections; idle ones closed; those with a request
      // under way are answered first (below), then closed.
      draining = true;
      drain_deadline = now_us() + 5'000'000;
      ::epoll_ctl(ep, EPOLL_CTL_DEL, lfd, nullptr);
      ::close(lfd);
      for (auto it = conns.begin(); it != conns.end();) {
        if (it->second.empty()) {
          ::close(it->first);
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (draining && (conns.empty() || now_us() > drain_deadline)) break;
    epoll_event evs[64];
    int n = ::epoll_wait(ep, evs, 64, 100);
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == lfd && !draining) {
        for (;;) {
          int c = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          epoll_event cev{};
          cev.events = EPOLLIN;
          cev.data.fd = c;
          ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
          conns[c];
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      char buf[8192];
      ssize_t got = ::read(fd, buf, sizeof buf);
      bool close_it = got <= 0;
      if (got > 0) it->second.append(buf, static_cast<size_t>(got));
      size_t end;
      while (!close_it && (end = it->second.find("\r\n\r\n")) != std::string::npos) {
        bool metrics = it->second.rfind("GET /metrics", 0) == 0;
        it->second.erase(0, end + 4);
        ++served;
        std::string text = body;
        if (metrics)
          text = "# TYPE service_requests_total counter\nservice_requests_total{port=\"" +
                 std::to_string(port) + "\"} " + std::to_string(served) +
                 "\n# TYPE service_in_flight gauge\nservice_in_flight " + in_flight + "\n";
        std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                           std::to_string(text.size()) + "\r\n" +
                           (draining ? "Connection: close\r\n" : "") + "\r\n" + text;
        (void)::send(fd, resp.data(), resp.size(), MSG_NOSIGNAL);
        if (draining) close_it = true;
      }
      if (it->second.size() > 65536) close_it = true;
      if (close_it) {
        ::close(fd);
        conns.erase(it);
      }
    }
  }
  return 0;
}

// ---- load ----

struct Endpoint {
  std::string ip;
  uint16_t port = 0;
};

// The SRV name's endpoints from the DNS server (target addresses from the additional
// section), cached for the answer's TTL as a local resolver would.
class Resolver {
 public:
  Resolver(std::string server_ip, uint16_t server_port, std::string name)
      : ip_(std::move(server_ip)), port_(server_port), name_(std::move(name)) {}
  // An endpoint at random; false when the name has none (or DNS did not answer).
  bool pick(std::mt19937& rng, Endpoint* out, bool* dns_failed) {
    std::vector<Endpoint> eps;
    {
      std::lock_guard lock(mu_);
      if (now_us() >= expires_us_) {
        std::vector<Endpoint> fresh;
        uint32_t ttl = 0;
        if (!query(&fresh, &ttl)) {
          *dns_failed = true;
          return false;
        }
        cached_ = std::move(fresh);
        expires_us_ = now_us() + uint64_t{ttl} * 1'000'000;
      }
      eps = cached_;
    }
    if (eps.empty()) return false;
    *out = eps[std::uniform_int_distribution<size_t>(0, eps.size() - 1)(rng)];
    return true;
  }

 private:
  bool query(std::vector<Endpoint>* out, uint32_t* ttl) {
    ldns_pkt* q = nullptr;
    if (ldns_pkt_query_new_frm_str(&q, name_.c_str(), LDNS_RR_TYPE_SRV, LDNS_RR_CLASS_IN,
                                   LDNS_RD) != LDNS_STATUS_OK)
      return false;
    ldns_pkt_set_id(q, static_cast<uint16_t>(now_us()));
    ldns_pkt_set_edns_udp_size(q, 4096);
    uint8_t* wire = nullptr;
    size_t wire_len = 0;
    bool ok = ldns_pkt2wire(&wire, q, &wire_len) == LDNS_STATUS_OK;
    ldns_pkt_free(q);
    if (!ok) return false;
    int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    ::inet_pton(AF_INET, ip_.c_str(), &a.sin_addr);
    ok = ::sendto(fd, wire, wire_len, 0, reinterpret_cast<sockaddr*>(&a), sizeof a) ==
         static_cast<ssize_t>(wire_len);
    std::free(wire);
    uint8_t buf[4096];
    pollfd p{fd, POLLIN, 0};
    ssize_t n = ok && ::poll(&p, 1, 1000) == 1 ? ::recv(fd, buf, sizeof buf, 0) : -1;
    ::close(fd);
    if (n <= 0) return false;
    ldns_pkt* r = nullptr;
    if (ldns_wire2pkt(&r, buf, static_cast<size_t>(n)) != LDNS_STATUS_OK) return false;
    std::map<std::string, std::string> addr;  // target -> address
    ldns_rr_list* add = ldns_pkt_additional(r);
    for (size_t i = 0; add && i < ldns_rr_list_rr_count(add); ++i) {
      ldns_rr* rr = ldns_rr_list_rr(add, i);
      if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_A) continue;
      char* owner = ldns_rdf2str(ldns_rr_owner(rr));
      char* value = ldns_rdf2str(ldns_rr_rdf(rr, 0));
      addr[owner] = value;
      std::free(owner);
      std::free(value);
    }
    *ttl = 1;
    ldns_rr_list* ans = ldns_pkt_answer(r);
    for (size_t i = 0; ans && i < ldns_rr_list_rr_count(ans); ++i) {
      ldns_rr* rr = ldns_rr_list_rr(ans, i);
      if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_SRV || ldns_rr_rd_count(rr) < 4) continue;
      *ttl = ldns_rr_ttl(rr);
      char* target = ldns_rdf2str(ldns_rr_rdf(rr, 3));
      auto it = addr.find(target);
      std::free(target);
      if (it == addr.end()) continue;
      out->push_back({it->second, ldns_rdf2native_int16(ldns_rr_rdf(rr, 2))});
    }
    ldns_pkt_free(r);
    return true;
  }
  std::string ip_;
  uint16_t port_;
  std::string name_;
  std::mutex mu_;
  std::vector<Endpoint> cached_;
  uint64_t expires_us_ = 0;
};

struct Totals {
  std::atomic<uint64_t> ok{0}, refused{0}, reset{0}, timeout{0}, server_error{0}, no_endpoint{0},
      dns_failed{0}, stale_retries{0}, connections{0};
  std::mutex mu;
  std::vector<uint32_t> latency_us;
};

int connect_to(const Endpoint& e, bool* refused) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(e.port);
  ::inet_pton(AF_INET, e.ip.c_str(), &a.sin_addr);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 1000) == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    } else {
      errno = ETIMEDOUT;
    }
  }
  if (rc != 0) {
    *refused = errno == ECONNREFUSED;
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// One GET on fd: 0 = answered (status in *status), 1 = the connection was closed before
// any byte of the answer (a reused one may be retried), 2 = reset or broken mid-answer,
// 3 = timed out.
int request(int fd, int* status, bool* close_after) {
  static const char req[] = "GET / HTTP/1.1\r\nHost: service\r\n\r\n";
  if (::send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req - 1))
    return 1;
  std::string in;
  uint64_t deadline = now_us() + 2'000'000;
  for (;;) {
    size_t head = in.find("\r\n\r\n");
    if (head != std::string::npos) {
      size_t cl = in.find("Content-Length: ");
      size_t want = cl == std::string::npos ? 0 : std::strtoul(in.c_str() + cl + 16, nullptr, 10);
      if (in.size() >= head + 4 + want) {
        *status = std::atoi(in.c_str() + 9);
        *close_after = in.find("Connection: close") != std::string::npos;
        return 0;
      }
    }
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>((deadline - std::min(deadline, now_us())) / 1000);
    if (left <= 0 || ::poll(&p, 1, left) != 1) return 3;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return in.empty() ? 1 : 2;
    in.append(buf, static_cast<size_t>(n));
  }
}

void worker(Resolver& dns, Totals& t, int per_connection, unsigned seed) {
  std::mt19937 rng(seed);
  int fd = -1, used = 0;
  while (!g_stop) {
    uint64_t start = now_us();
    bool done = false;
    for (int attempt = 0; attempt < 2 && !done; ++attempt) {
      bool reused = fd >= 0;
      if (fd < 0) {
        Endpoint e;
        bool dns_failed = false;
        if (!dns.pick(rng, &e, &dns_failed)) {
          ++(dns_failed ? t.dns_failed : t.no_endpoint);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          done = true;
          break;
        }
        bool refused = false;
        fd = connect_to(e, &refused);
        ++t.connections;
        if (fd < 0) {
          ++(refused ? t.refused : t.timeout);
          done = true;
          break;
        }
        used = 0;
      }
      int status = 0;
      bool close_after = false;
      int r = request(fd, &status, &close_after);
      if (r == 1 && reused && attempt == 0) {
        // A kept-alive connection the server had closed: a new one, as clients do.
        ::close(fd);
        fd = -1;
        ++t.stale_retries;
        continue;
      }
      done = true;
      if (r == 0 && status < 500) {
        ++t.ok;
        std::lock_guard lock(t.mu);
        t.latency_us.push_back(
            static_cast<uint32_t>(std::min<uint64_t>(now_us() - start, UINT32_MAX)));
      } else if (r == 0) {
        ++t.server_error;
      } else if (r == 3) {
        ++t.timeout;
      } else {
        ++t.reset;
      }
      if (r != 0 || close_after || ++used >= per_connection) {
        ::close(fd);
        fd = -1;
      }
    }
  }
  if (fd >= 0) ::close(fd);
}

int load(const std::string& dns_server, const std::string& name, int workers, int per_connection) {
  auto colon = dns_server.rfind(':');
  Resolver dns(dns_server.substr(0, colon),
               static_cast<uint16_t>(std::atoi(dns_server.c_str() + colon + 1)), name);
  Totals t;
  std::vector<std::thread> threads;
  uint64_t start = now_us();
  for (int i = 0; i < workers; ++i)
    threads.emplace_back(
        [&, i] { worker(dns, t, per_connection, 1234u + static_cast<unsigned>(i)); });
  for (auto& th : threads) th.join();
  double secs = static_cast<double>(now_us() - start) / 1e6;
  std::sort(t.latency_us.begin(), t.latency_us.end());
  auto pct = [&](double p) {
    if (t.latency_us.empty()) return 0.0;
    size_t i = std::min(t.latency_us.size() - 1,
                        static_cast<size_t>(p / 100 * static_cast<double>(t.latency_us.size())));
    return t.latency_us[i] / 1000.0;
  };
  uint64_t failed = t.refused + t.reset + t.timeout + t.server_error;
  std::printf(
      "{\"seconds\": %.2f, \"requests\": %llu, \"failed\": %llu, \"refused\": %llu, "
      "\"reset\": %llu, \"timeout\": %llu, \"server_error\": %llu, \"no_endpoint\": %llu, "
      "\"dns_failed\": %llu, \"stale_retries\": %llu, \"connections\": %llu, "
      "\"p50_ms\": %.2f, \"p99_ms\": %.2f, \"max_ms\": %.2f}\n",
      secs, static_cast<unsigned long long>(t.ok + failed), static_cast<unsigned long long>(failed),
      static_cast<unsigned long long>(t.refused.load()),
      static_cast<unsigned long long>(t.reset.load()),
      static_cast<unsigned long long>(t.timeout.load()),
      static_cast<unsigned long long>(t.server_error.load()),
      static_cast<unsigned long long>(t.no_endpoint.load()),
      static_cast<unsigned long long>(t.dns_failed.load()),
      static_cast<unsigned long long>(t.stale_retries.load()),
      static_cast<unsigned long long>(t.connections.load()), pct(50), pct(99), pct(100));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  std::string mode = argc > 1 ? argv[1] : "";
  std::map<std::string, std::string> opt;
  for (int i = 2; i + 1 < argc; i += 2) opt[argv[i]] = argv[i + 1];
  auto get = [&](const char* k, const std::string& d) {
    auto it = opt.find(k);
    return it == opt.end() ? d : it->second;
  };
  if (mode == "serve") {
    const char* env = std::getenv("WEFT_PORT_HTTP");
    int port = std::atoi(get("--port", env ? env : "0").c_str());
    if (port <= 0 || port > 65535) {
      std::fprintf(stderr, "service_load serve: --port or WEFT_PORT_HTTP is required\n");
      return 2;
    }
    return serve(port);
  }
  if (mode == "load" && opt.count("--name"))
    return load(get("--dns", "127.0.0.1:8600"), opt["--name"],
                std::max(1, std::atoi(get("--workers", "16").c_str())),
                std::max(1, std::atoi(get("--per-connection", "20").c_str())));
  std::fprintf(stderr,
               "usage: service_load serve [--port N]\n"
               "       service_load load --name _http._tcp.JOB.ENT.weft. [--dns HOST:PORT] "
               "[--workers N] [--per-connection N]\n");
  return 2;
}
