// The agent's DNS server over real sockets (UDP and TCP on loopback), run on an event
// loop in this thread while a client thread asks: the TCP framing takes garbage, a
// message split across writes, a length that never completes, and more connections than
// the bound, and keeps answering everyone else.
#include "agent/dns_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include "common/ldns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

#include "testing/dns_query.h"

namespace weft::agent {
namespace {

std::vector<uint8_t> query(const char* name, uint16_t id) {
  return weft::testing::dns_query(name, LDNS_RR_TYPE_A, id);
}

// The answer's id and its number of answer records; -1, -1 if it does not parse.
std::pair<int, int> parse(const uint8_t* data, size_t size) {
  ldns_pkt* p = nullptr;
  if (ldns_wire2pkt(&p, data, size) != LDNS_STATUS_OK || !p) return {-1, -1};
  std::pair<int, int> out{ldns_pkt_id(p), static_cast<int>(ldns_pkt_ancount(p))};
  ldns_pkt_free(p);
  return out;
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A connection to 127.0.0.1:port, from `from` (another loopback address: another
// client, as far as the server can tell) when given.
int tcp_connect(uint16_t port, const char* from = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (from) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &src.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a = loopback(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

std::string framed(const std::vector<uint8_t>& msg) {
  std::string s;
  s.push_back(static_cast<char>(msg.size() >> 8));
  s.push_back(static_cast<char>(msg.size() & 0xff));
  s.append(reinterpret_cast<const char*>(msg.data()), msg.size());
  return s;
}

// One framed answer read from `fd`: its id and answer count; {-1, -1} on EOF or timeout.
std::pair<int, int> read_framed(int fd) {
  uint8_t len[2];
  size_t got = 0;
  while (got < 2) {
    ssize_t n = ::recv(fd, len + got, 2 - got, 0);
    if (n <= 0) return {-1, -1};
    got += static_cast<size_t>(n);
  }
  std::vector<uint8_t> msg((len[0] << 8) | len[1]);
  got = 0;
  while (got < msg.size()) {
    ssize_t n = ::recv(fd, msg.data() + got, msg.size() - got, 0);
    if (n <= 0) return {-1, -1};
    got += static_cast<size_t>(n);
  }
  return parse(msg.data(), msg.size());
}

std::pair<int, int> ask_udp(uint16_t port, uint16_t id) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto q = query("web.frontend.weft.", id);
  sockaddr_in a = loopback(port);
  ::sendto(fd, q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
  uint8_t buf[4096];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ::close(fd);
  return n > 0 ? parse(buf, static_cast<size_t>(n)) : std::pair{-1, -1};
}

// web.frontend.weft. with `n` endpoints.
void add_web(ServiceCatalog* catalog, int n) {
  ServiceUpdate u;
  u.version = 1;
  Service web;
  web.entitlement = "frontend";
  for (int i = 0; i < n; ++i)
    web.endpoints.push_back({"web." + std::to_string(i),
                             i,
                             1,
                             "m" + std::to_string(i),
                             "10.0.0." + std::to_string(i + 1),
                             {{"http", 20001}}});
  u.services["web"] = web;
  catalog->apply(u);
}

// The loop runs here; `client` asks from its own thread (a failed assertion there ends
// it early, and the loop with it).
void serve_while(EventLoop& loop, const std::function<void()>& client) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    client();
    done = true;
  });
  while (!done) ASSERT_TRUE(loop.run_once(20'000).ok());
  t.join();
}

TEST(DnsServer, TcpFramingTakesGarbageSplitsStallsAndFloodsAndKeepsAnswering) {
  ServiceCatalog catalog;
  add_web(&catalog, 2);
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto server = DnsServer::serve(**loop, "127.0.0.1:0", &catalog, dns::Options{});
  ASSERT_TRUE(server.ok()) << server.error().str();
  uint16_t port = (*server)->port();
  ASSERT_NE(port, 0);

  auto ask_everything = [&] {
    EXPECT_EQ(ask_udp(port, 1), (std::pair{1, 2}));
    // Garbage in a well-formed frame: no answer or an error answer, and the connection
    // still answers the next query.
    int a = tcp_connect(port);
    ASSERT_GE(a, 0);
    send_all(a, std::string("\x00\x05garbage", 9).substr(0, 7));
    send_all(a, framed(query("web.frontend.weft.", 2)));
    std::pair<int, int> r = read_framed(a);
    if (r.first != 2) r = read_framed(a);  // the garbage's own error answer came first
    EXPECT_EQ(r, (std::pair{2, 2}));
    // A query split across writes, one byte at a time for its length.
    std::string q3 = framed(query("web.frontend.weft.", 3));
    send_all(a, q3.substr(0, 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    send_all(a, q3.substr(1, 5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    send_all(a, q3.substr(6));
    EXPECT_EQ(read_framed(a), (std::pair{3, 2}));
    // A length that promises 65,535 bytes and never sends them: this connection waits,
    // nobody else does.
    int stalled = tcp_connect(port);
    ASSERT_GE(stalled, 0);
    send_all(stalled, std::string("\xff\xff\x01\x02", 4));
    send_all(a, framed(query("web.frontend.weft.", 4)));
    EXPECT_EQ(read_framed(a), (std::pair{4, 2}));
    // More connections from one address than its share (16): the oldest of its are
    // closed to make room, so at most 16 stay open, the newest answer, and UDP does.
    std::vector<int> flood;
    for (int i = 0; i < 40; ++i) flood.push_back(tcp_connect(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    int closed = 0;
    for (int fd : flood) {
      if (fd < 0) continue;
      pollfd p{fd, POLLIN, 0};
      char c;
      if (::poll(&p, 1, 0) == 1 && ::recv(fd, &c, 1, MSG_DONTWAIT) == 0) ++closed;
    }
    EXPECT_GE(closed, 40 - 16);
    EXPECT_EQ(ask_udp(port, 5), (std::pair{5, 2}));
    send_all(flood.back(), framed(query("web.frontend.weft.", 6)));
    EXPECT_EQ(read_framed(flood.back()), (std::pair{6, 2}));
    for (int fd : flood)
      if (fd >= 0) ::close(fd);
    ::close(stalled);
    ::close(a);
  };
  serve_while(**loop, ask_everything);
  EXPECT_GE((*server)->queries(), 5u);
}

// Slowloris: 80 clients (each from an address of its own) hold connections and trickle
// a byte now and then, never finishing a query. Fresh queries over TCP are still
// answered, each at once, and the trickling connections are closed: none may hold a slot
// by sending bytes that never make a query.
TEST(DnsServer, ClientsThatTrickleBytesDoNotKeepFreshQueriesOut) {
  ServiceCatalog catalog;
  add_web(&catalog, 1);
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto server = DnsServer::serve(**loop, "127.0.0.1:0", &catalog, dns::Options{});
  ASSERT_TRUE(server.ok()) << server.error().str();
  uint16_t port = (*server)->port();

  int answered = 0, trickled_closed = 0;
  auto attack = [&] {
    std::vector<int> slow;
    for (int i = 0; i < 80; ++i) {
      std::string from = "127.0.1." + std::to_string(i + 1);
      int fd = tcp_connect(port, from.c_str());
      ASSERT_GE(fd, 0) << from;
      slow.push_back(fd);
    }
    auto trickle = [&] {
      for (int fd : slow) (void)::send(fd, "\xff", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    };
    // Seven fresh queries, each from a new client, while the slow ones trickle.
    for (int q = 0; q < 7; ++q) {
      trickle();
      std::string from = "127.0.2." + std::to_string(q + 1);
      int fd = tcp_connect(port, from.c_str());
      ASSERT_GE(fd, 0);
      send_all(fd, framed(query("web.frontend.weft.", static_cast<uint16_t>(100 + q))));
      if (read_framed(fd) == std::pair{100 + q, 1}) ++answered;
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Past the query deadline (3 s) every trickling connection is closed, whatever it
    // still sends.
    for (int i = 0; i < 40; ++i) {
      trickle();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int fd : slow) {
      pollfd p{fd, POLLIN, 0};
      char c;
      if (::poll(&p, 1, 2000) == 1 && ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0) ++trickled_closed;
      ::close(fd);
    }
  };
  serve_while(**loop, attack);
  EXPECT_EQ(answered, 7);
  EXPECT_EQ(trickled_closed, 80);
}

// Issue 46 (docs/services.md "Interest"): a query for a job the agent has not asked the
// control plane about waits while it asks, and is answered from what the answer
// brought; one whose answer never comes is answered from the copy after kWaitUs, over
// UDP and TCP alike; a job asked about before is answered at once.
TEST(DnsServer, AQueryForAJobNotAskedAboutWaitsForTheAnswer) {
  ServiceCatalog catalog;
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto server = DnsServer::serve(**loop, "127.0.0.1:0", &catalog, dns::Options{});
  ASSERT_TRUE(server.ok()) << server.error().str();
  DnsServer* dns = server->get();
  uint16_t port = dns->port();
  std::set<std::string> asked, waiting;
  std::vector<std::string> seen;
  Source answer_web;
  dns->hold_while([&](const std::string& job) {
    seen.push_back(job);
    if (waiting.count(job)) return true;
    if (asked.count(job)) return false;
    asked.insert(job);
    waiting.insert(job);
    if (job == "web") {  // the control plane answers in 200 ms; "db" it never answers
      auto t = (*loop)->add_timer_in(200'000, [&] {
        add_web(&catalog, 2);
        waiting.erase("web");
        dns->answered();
      });
      if (t.ok()) answer_web = std::move(t).value();
    }
    return true;
  });
  using clock = std::chrono::steady_clock;
  std::pair<int, int> first, again, db_tcp;
  double first_s = 0, again_s = 0, db_s = 0;
  serve_while(**loop, [&] {
    auto t0 = clock::now();
    first = ask_udp(port, 7);
    first_s = std::chrono::duration<double>(clock::now() - t0).count();
    t0 = clock::now();
    again = ask_udp(port, 8);
    again_s = std::chrono::duration<double>(clock::now() - t0).count();
    int fd = tcp_connect(port);
    ASSERT_GE(fd, 0);
    t0 = clock::now();
    send_all(fd, framed(query("_http._tcp.db.frontend.weft.", 9)));
    db_tcp = read_framed(fd);
    db_s = std::chrono::duration<double>(clock::now() - t0).count();
    ::close(fd);
  });
  EXPECT_EQ(first, (std::pair{7, 2}));  // both endpoints, from the answer
  EXPECT_GE(first_s, 0.15);
  EXPECT_EQ(again, (std::pair{8, 2}));
  EXPECT_LT(again_s, 0.15);
  EXPECT_EQ(db_tcp, (std::pair{9, 0}));  // nothing known of db: answered at the deadline
  EXPECT_GE(db_s, 0.9);
  EXPECT_LT(db_s, 3.0);
  EXPECT_EQ(dns->waited(), 2u);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), "db"), 2);  // asked, then due
}

}  // namespace
}  // namespace weft::agent
