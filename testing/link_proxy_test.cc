// The test's own partitions (testing/link_proxy.h): a held link carries nothing and loses
// nothing; healed, what waited arrives in order; one way held, the other flows; a server
// that goes away closes the client's side.
#include "testing/link_proxy.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <filesystem>
#include <string>

namespace weft::testing {
namespace {

int listen_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  ::unlink(path.c_str());
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(fd, 8), 0);
  return fd;
}

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// What arrives on fd within `ms` (all of it up to `want` bytes), "" when nothing does.
std::string read_for(int fd, size_t want, int ms) {
  std::string got;
  while (got.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) break;
    char buf[256];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(LinkProxy, AHeldLinkCarriesNothingAndLosesNothing) {
  struct Dir {  // removed however the test ends
    std::string path =
        std::filesystem::temp_directory_path() / ("weft-link-" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() { std::filesystem::remove_all(path); }
  } tmp;
  const std::string& dir = tmp.path;
  int server = listen_unix(dir + "/server.sock");
  auto proxy = LinkProxy::unix_socket(dir + "/proxy.sock", dir + "/server.sock");
  ASSERT_TRUE(proxy);
  int client = connect_unix(proxy->endpoint());
  int peer = ::accept4(server, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(peer, 0);
  ASSERT_EQ(::write(client, "one", 3), 3);
  EXPECT_EQ(read_for(peer, 3, 5000), "one");
  proxy->hold(LinkProxy::Held::kBoth);
  ASSERT_EQ(::write(client, "two", 3), 3);
  ASSERT_EQ(::write(peer, "back", 4), 4);
  // Held: a short wait that must see nothing (the heal below is what it waits for).
  EXPECT_EQ(read_for(peer, 3, 300), "");
  EXPECT_EQ(read_for(client, 4, 10), "");
  proxy->hold(LinkProxy::Held::kToServer);  // one way: the answer flows, the call waits
  EXPECT_EQ(read_for(client, 4, 5000), "back");
  EXPECT_EQ(read_for(peer, 3, 300), "");
  proxy->heal();
  EXPECT_EQ(read_for(peer, 3, 5000), "two") << "what waited arrives, in order";
  // The server goes away: the client's side closes.
  ::close(peer);
  char c;
  pollfd p{client, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_EQ(::read(client, &c, 1), 0);
  ::close(client);
  ::close(server);
}

}  // namespace
}  // namespace weft::testing
