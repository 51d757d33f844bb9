#include "common/http_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <optional>

#include "common/clock.h"
#include "common/fs.h"
#include "common/metrics.h"

namespace weft {
namespace {

// Runs the loop until the request ends (or 5 s pass).
std::optional<Result<HttpResponse>> fetch(EventLoop& loop, HttpClient& c, HttpRequest req) {
  std::optional<Result<HttpResponse>> got;
  auto id = c.get(std::move(req), [&](Result<HttpResponse> r) { got = std::move(r); });
  EXPECT_TRUE(id.ok());
  uint64_t start = now_monotonic_us();
  while (!got && now_monotonic_us() - start < 5'000'000) (void)loop.run_once(10'000);
  return got;
}

// A listening socket on loopback that accepts nothing: connections complete (the
// kernel's backlog) and are never answered.
uint16_t silent_listener(Fd* fd) {
  *fd = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd->get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(fd->get(), 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd->get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

TEST(HttpClient, GetsStatusAndBodyWithoutBlockingTheLoop) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  metrics::Registry registry;
  registry.add([](metrics::Writer& w) {
    w.family("probe_total", "counter", "A sample.");
    w.sample("probe_total", 7);
  });
  auto server = metrics::HttpServer::start(**loop, "127.0.0.1:0", &registry);
  ASSERT_TRUE(server.ok()) << server.error().str();
  auto client = HttpClient::create(**loop);
  ASSERT_TRUE(client.ok());
  std::string base = "http://127.0.0.1:" + std::to_string((*server)->port());

  int opened = 0;
  HttpRequest req{base + "/metrics"};
  req.open_socket = [&](int family, int type, int protocol) {
    ++opened;
    return ::socket(family, type, protocol);
  };
  auto ok = fetch(**loop, **client, req);
  ASSERT_TRUE(ok && ok->ok()) << (ok ? ok->error().str() : "no answer");
  EXPECT_EQ((*ok)->status, 200);
  EXPECT_NE((*ok)->body.find("probe_total 7"), std::string::npos) << (*ok)->body;
  EXPECT_EQ(opened, 1);  // the caller's socket was used

  HttpRequest small{base + "/metrics"};
  small.max_body = 5;
  auto cut = fetch(**loop, **client, small);
  ASSERT_TRUE(cut && cut->ok());
  EXPECT_EQ((*cut)->body.size(), 5u);

  auto missing = fetch(**loop, **client, HttpRequest{base + "/nothing"});
  ASSERT_TRUE(missing && missing->ok());
  EXPECT_EQ((*missing)->status, 404);
  EXPECT_EQ((*client)->in_flight(), 0u);
}

TEST(HttpClient, RefusedAndSilentPeersFailWithinTheTimeout) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto client = HttpClient::create(**loop);
  ASSERT_TRUE(client.ok());
  Fd listener;
  uint16_t port = silent_listener(&listener);

  HttpRequest silent{"http://127.0.0.1:" + std::to_string(port) + "/"};
  silent.timeout_us = 200'000;
  uint64_t start = now_monotonic_us();
  auto slow = fetch(**loop, **client, silent);
  uint64_t took = now_monotonic_us() - start;
  ASSERT_TRUE(slow.has_value());
  EXPECT_FALSE(slow->ok());
  EXPECT_GE(took, 150'000u);
  EXPECT_LT(took, 2'000'000u);

  listener.reset();  // nothing listens on that port any more
  auto refused = fetch(**loop, **client, HttpRequest{"http://127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(refused.has_value());
  EXPECT_FALSE(refused->ok());

  HttpRequest bad{"http://127.0.0.1:1/"};
  bad.open_socket = [](int, int, int) {
    errno = EPERM;
    return -1;
  };
  auto no_socket = fetch(**loop, **client, bad);
  ASSERT_TRUE(no_socket.has_value());
  EXPECT_FALSE(no_socket->ok());

  auto other = fetch(**loop, **client, HttpRequest{"file:///etc/passwd"});
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE(other->ok());  // http and https only
}

TEST(HttpClient, ACancelledRequestNeverCallsBack) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto client = HttpClient::create(**loop);
  ASSERT_TRUE(client.ok());
  Fd listener;
  uint16_t port = silent_listener(&listener);
  HttpRequest req{"http://127.0.0.1:" + std::to_string(port) + "/"};
  req.timeout_us = 100'000;
  bool called = false;
  auto id = (*client)->get(req, [&](Result<HttpResponse>) { called = true; });
  ASSERT_TRUE(id.ok());
  (void)(*loop)->run_once(10'000);
  (*client)->cancel(*id);
  EXPECT_EQ((*client)->in_flight(), 0u);
  uint64_t start = now_monotonic_us();
  while (now_monotonic_us() - start < 300'000) (void)(*loop)->run_once(10'000);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace weft
