// For tests and benchmarks: loopback TCP ports for child processes to listen on.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace weft::testing {

// A TCP port on 127.0.0.1 that no other test of this machine is using, for a child
// process to listen on. Tests run side by side (ctest -j), so "bind port 0, read it,
// close it" is not enough: two tests could be handed the same port, or an outgoing
// connection could take it as its source port before the child binds it. So:
//  - the port is taken below the kernel's ephemeral range (ip_local_port_range), which
//    the kernel never hands out by itself;
//  - it is reserved for the life of this process by an abstract Unix socket named after
//    it ("weft-test-port-N"), which another test's free_tcp_port() cannot bind and which
//    the kernel removes when this process ends, however it ends.
inline uint16_t free_tcp_port() {
  static std::vector<int> reservations;  // open until the process ends
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int hi = 0;
    if (std::fscanf(f, "%d %d", &low, &hi) != 2) low = 32768;
    std::fclose(f);
  }
  const int first = 10000, span = low - first;
  if (span < 1000) return 0;
  std::random_device rd;
  std::mt19937 gen(rd());
  for (int attempt = 0; attempt < 2000; ++attempt) {
    int port = first + static_cast<int>(gen() % static_cast<unsigned>(span));
    int u = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u < 0) return 0;
    sockaddr_un ua{};
    ua.sun_family = AF_UNIX;
    std::string name = "weft-test-port-" + std::to_string(port);
    std::memcpy(ua.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    socklen_t ulen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (::bind(u, reinterpret_cast<sockaddr*>(&ua), ulen) != 0) {
      ::close(u);  // another test holds it
      continue;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bool free = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    if (!free) {
      ::close(u);  // in use by something that is not a test
      continue;
    }
    reservations.push_back(u);
    return static_cast<uint16_t>(port);
  }
  return 0;
}

}  // namespace weft::testing
