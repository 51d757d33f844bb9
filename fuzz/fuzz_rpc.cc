// The line protocol as a daemon serves it: bytes from a peer, split into lines, parsed
// and dispatched (requests, batches, replies to this side's calls, methods that read
// their params as text). Nothing may crash,
// throw into the loop or grow without bound.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "common/json_bounded.h"
#include "common/rpc/session.h"
#include "common/task_report.h"

using namespace weft;
using namespace weft::rpc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto loop = std::move(EventLoop::create()).value();
  static Dispatcher d = [] {
    Dispatcher x;
    x.add("echo", [](const json& p, const CallContext&) -> Result<json> { return p; });
    x.add("fail", [](const json& p, const CallContext&) -> Result<json> {
      return field_error(p.value("field", std::string("x")), "bad");
    });
    // Read as text (the control plane's machine.report path), answered with what it got.
    x.add_raw("raw", [](std::string_view text, const CallContext&) -> Result<json> {
      if (text.empty() || text.front() != '{' || text.back() != '}') __builtin_trap();
      auto report = parse_task_report(text);
      return report.ok() ? json(report->digest) : json(std::string(text.substr(0, 64)));
    });
    return x;
  }();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) return 0;
  {
    Session s(*loop, Fd(sv[0]), Peer{}, &d, 4096);
    if (!s.start().ok()) return 0;
    // A call of ours, so that replies in the input have something to match.
    s.call("echo", json::object(), [](Result<json>) {});
    size_t off = 0;
    while (off < size && !s.closed()) {
      ssize_t n = ::write(sv[1], data + off, size - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
      for (int i = 0; i < 4; ++i) (void)loop->run_once(0);
      char sink[65536];
      while (::read(sv[1], sink, sizeof sink) > 0) {
      }
    }
    for (int i = 0; i < 4; ++i) (void)loop->run_once(0);
  }
  ::close(sv[1]);
  // The same bytes as one line for the bounded JSON parser.
  (void)parse_json_bounded(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
