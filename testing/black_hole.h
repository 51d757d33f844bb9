// A loopback port that never answers, for the tests that a connect never blocks an event
// loop (common/rpc/rpc_test.cc, tests/cluster_root_test.cc): a listener with a backlog of
// none whose accept queue four connections fill, so the kernel drops further SYNs and a
// connect to it waits until its own timeout. Made when the queue is full.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/fs.h"

namespace weft::testing {

struct BlackHole {
  Fd listener;
  std::vector<Fd> fillers;
  sockaddr_in addr{};
  uint16_t port() const { return ntohs(addr.sin_port); }
};

// Port 0 (with a test failure) when the listener cannot be made.
inline BlackHole black_hole() {
  BlackHole h;
  h.listener = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  h.addr.sin_family = AF_INET;
  h.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto* sa = reinterpret_cast<sockaddr*>(&h.addr);
  socklen_t sl = sizeof h.addr;
  if (::bind(h.listener.get(), sa, sizeof h.addr) != 0 || ::listen(h.listener.get(), 0) != 0 ||
      ::getsockname(h.listener.get(), sa, &sl) != 0) {
    ADD_FAILURE() << "cannot make a listener on loopback";
    h.addr.sin_port = 0;
    return h;
  }
  for (int i = 0; i < 4; ++i) {
    Fd f(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    (void)::connect(f.get(), sa, sizeof h.addr);
    h.fillers.push_back(std::move(f));
  }
  // The queue is full once the first one's handshake is done (the others' SYNs are
  // dropped): waited for, two seconds at the most.
  pollfd p{h.fillers[0].get(), POLLOUT, 0};
  if (::poll(&p, 1, 2000) != 1) ADD_FAILURE() << "the accept queue did not fill";
  return h;
}

}  // namespace weft::testing
