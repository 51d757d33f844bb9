#include "common/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/clock.h"
#include "common/fs.h"
#include "common/strings.h"

namespace weft::metrics {
namespace {

TEST(Metrics, TextExpositionOfSamplesAndHistograms) {
  Histogram h({0.01, 0.1});
  h.observe(0.005);
  h.observe(0.05);
  h.observe(3);
  Writer w;
  w.family("weft_test_seconds", "histogram", "How long.");
  h.write(w, "weft_test_seconds", {{"method", "job.create"}});
  w.family("weft_test_tasks", "gauge", "Tasks by state.");
  w.sample("weft_test_tasks", 7, {{"state", "run\"ning\\\n"}});
  EXPECT_EQ(w.text(),
            "# HELP weft_test_seconds How long.\n"
            "# TYPE weft_test_seconds histogram\n"
            "weft_test_seconds_bucket{method=\"job.create\",le=\"0.01\"} 1\n"
            "weft_test_seconds_bucket{method=\"job.create\",le=\"0.1\"} 2\n"
            "weft_test_seconds_bucket{method=\"job.create\",le=\"+Inf\"} 3\n"
            "weft_test_seconds_sum{method=\"job.create\"} 3.055\n"
            "weft_test_seconds_count{method=\"job.create\"} 3\n"
            "# HELP weft_test_tasks Tasks by state.\n"
            "# TYPE weft_test_tasks gauge\n"
            "weft_test_tasks{state=\"run\\\"ning\\\\\\n\"} 7\n");
}

TEST(Metrics, ListenAddressesAreNumeric) {
  EXPECT_TRUE(check_listen("").ok());
  EXPECT_TRUE(check_listen("127.0.0.1:9470").ok());
  EXPECT_TRUE(check_listen("[::1]:9470").ok());
  EXPECT_FALSE(check_listen("localhost:9470").ok());  // no DNS on the loop
  EXPECT_FALSE(check_listen("127.0.0.1").ok());
  EXPECT_FALSE(check_listen("127.0.0.1:99999").ok());
  EXPECT_FALSE(check_listen("127.0.0.1:9x").ok());
  EXPECT_TRUE(check_listen("unix:/run/weft/agent-metrics.sock").ok());
  EXPECT_FALSE(check_listen("unix:relative.sock").ok());
  EXPECT_FALSE(check_listen("unix:/" + std::string(200, 'x')).ok());
}

// One HTTP/1.0 exchange from another thread while the loop serves (to loopback:port,
// or to the Unix socket `path`).
std::string http(EventLoop& loop, uint16_t port, const std::string& request,
                 const std::string& path = "") {
  std::atomic<bool> done{false};
  std::string response;
  std::thread client([&] {
    int fd = ::socket(path.empty() ? AF_INET : AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sockaddr_un u{};
    u.sun_family = AF_UNIX;
    std::snprintf(u.sun_path, sizeof u.sun_path, "%s", path.c_str());
    int c = path.empty() ? ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)
                         : ::connect(fd, reinterpret_cast<sockaddr*>(&u), sizeof u);
    if (c == 0) {
      (void)!::write(fd, request.data(), request.size());
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) response.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    done = true;
  });
  uint64_t start = now_monotonic_us();
  while (!done && now_monotonic_us() - start < 5'000'000) (void)loop.run_once(10'000);
  client.join();
  return response;
}

TEST(Metrics, ServedOverHttpFromTheDaemonsLoop) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  Registry registry;
  int scrapes = 0;
  registry.add([&](Writer& w) {
    ++scrapes;
    w.family("weft_test_up", "gauge", "Always 1.");
    w.sample("weft_test_up", 1);
  });
  auto server = HttpServer::start(**loop, "127.0.0.1:0", &registry);
  ASSERT_TRUE(server.ok()) << server.error().str();
  uint16_t port = (*server)->port();
  ASSERT_NE(port, 0);
  std::string ok = http(**loop, port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_NE(ok.find("200 OK"), std::string::npos) << ok;
  EXPECT_NE(ok.find("text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_NE(ok.find("\nweft_test_up 1\n"), std::string::npos) << ok;
  EXPECT_EQ(scrapes, 1);
  std::string missing = http(**loop, port, "GET /other HTTP/1.0\r\n\r\n");
  EXPECT_NE(missing.find("404"), std::string::npos) << missing;
  std::string post = http(**loop, port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_NE(post.find("405"), std::string::npos) << post;
  std::string junk = http(**loop, port, "\x01\x02 garbage\r\n\r\n");
  EXPECT_EQ(junk.find("200 OK"), std::string::npos);
  // Still serving after all of that.
  EXPECT_NE(http(**loop, port, "GET /metrics HTTP/1.0\r\n\r\n").find("weft_test_up 1"),
            std::string::npos);
  // The port is taken: a second server there fails with the address named.
  auto twice = HttpServer::start(**loop, "127.0.0.1:" + std::to_string(port), &registry);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().str().find("127.0.0.1"), std::string::npos);
}

// Issue 32 (11): on loopback a local user can take the port first or hold its
// connections; a Unix socket (0660) leaves that to the file's permissions. A stale
// socket is replaced, another file is not.
TEST(Metrics, ServedOnAUnixSocketOfItsOwn) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  Registry registry;
  registry.add([](Writer& w) {
    w.family("weft_test_up", "gauge", "Always 1.");
    w.sample("weft_test_up", 1);
  });
  std::string dir = std::filesystem::temp_directory_path() / ("weft-metrics-" + random_hex(4));
  ASSERT_TRUE(mkdir_p(dir).ok());
  std::string path = dir + "/metrics.sock";
  for (int round = 0; round < 2; ++round) {  // the second finds the first's stale socket
    auto server = HttpServer::start(**loop, "unix:" + path, &registry);
    ASSERT_TRUE(server.ok()) << server.error().str();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u);
    std::string ok = http(**loop, 0, "GET /metrics HTTP/1.0\r\n\r\n", path);
    EXPECT_NE(ok.find("\nweft_test_up 1\n"), std::string::npos) << ok;
  }
  ASSERT_TRUE(write_file(dir + "/file", "x").ok());
  EXPECT_FALSE(HttpServer::start(**loop, "unix:" + dir + "/file", &registry).ok());
  EXPECT_EQ(read_file(dir + "/file").value_or(""), "x");
  (void)remove_tree(dir);
}

}  // namespace
}  // namespace weft::metrics
