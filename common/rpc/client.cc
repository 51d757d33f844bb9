// The protocol's pieces a blocking client needs (error mapping, line splitting, endpoints,
// the blocking connect and Client), apart from the event-loop sessions and servers in
// rpc.cc: a program that links only these (weftctl) loads neither libsystemd nor the
// event loop.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/rpc/client.h"
#include "common/rpc/detail.h"
#include "common/strings.h"

namespace weft::rpc {

RpcError to_rpc_error(const Error& e, int fallback) {
  RpcError r;
  r.code = e.code != 0 ? e.code : (!e.field.empty() ? kInvalidParams : fallback);
  r.message = e.str();
  if (!e.field.empty()) r.data = json{{"field", e.field}};
  if (e.code == kNotLeader) r.data = json{{"leader", e.leader}};
  if (e.code == kMoved) r.data = json{{"endpoints", e.leader}};
  return r;
}

Error from_rpc_error(const RpcError& e) {
  // The message already names the field (to_rpc_error put it there), so `field` stays
  // empty and str() does not repeat it.
  Error err = make_error(e.message);
  err.code = e.code;
  if (e.code == kNotLeader && e.data.is_object() && e.data.contains("leader") &&
      e.data["leader"].is_string() && e.data["leader"].get<std::string>().size() <= 255)
    err.leader = e.data["leader"].get<std::string>();
  if (e.code == kMoved && e.data.is_object() && e.data.contains("endpoints") &&
      e.data["endpoints"].is_string() && e.data["endpoints"].get<std::string>().size() <= 4096)
    err.leader = e.data["endpoints"].get<std::string>();
  return err;
}

json error_object(const RpcError& e) {
  json o{{"code", e.code}, {"message", e.message}};
  if (!e.data.is_null()) o["data"] = e.data;
  return o;
}

// ---- LineReader ----

void LineReader::feed(const char* data, size_t n) {
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(data, n);
}

LineReader::Kind LineReader::next(std::string* line) {
  for (;;) {
    size_t nl = buf_.find('\n', pos_);
    if (skipping_) {
      if (nl == std::string::npos) {
        buf_.clear();
        pos_ = 0;
        break;
      }
      pos_ = nl + 1;
      skipping_ = false;
      continue;
    }
    if (nl == std::string::npos) {
      if (buf_.size() - pos_ > max_) {
        // Too long and still no newline: drop what we have and skip to the next one.
        buf_.clear();
        pos_ = 0;
        skipping_ = true;
        overflow_pending_ = true;
      }
      break;
    }
    size_t len = nl - pos_;
    if (len > max_) {
      pos_ = nl + 1;
      return Kind::kOverflow;
    }
    line->assign(buf_, pos_, len);
    if (!line->empty() && line->back() == '\r') line->pop_back();
    pos_ = nl + 1;
    return Kind::kLine;
  }
  if (overflow_pending_) {
    overflow_pending_ = false;
    return Kind::kOverflow;
  }
  return Kind::kNone;
}

RpcError error_from_json(const json& e) {
  RpcError re;
  if (!e.is_object()) {
    re.message = "malformed error reply";
    return re;
  }
  auto code = e.find("code");
  if (code != e.end() && code->is_number_integer()) {
    int64_t c = code->get<int64_t>();
    if (c >= INT32_MIN && c <= INT32_MAX) re.code = static_cast<int>(c);
  }
  auto msg = e.find("message");
  if (msg != e.end() && msg->is_string()) re.message = msg->get<std::string>();
  auto data = e.find("data");
  if (data != e.end()) re.data = *data;
  return re;
}

// ---- Endpoints ----

Result<Endpoint> parse_endpoint(const std::string& s) {
  Endpoint ep;
  std::string rest = s;
  if (rest.rfind("unix:", 0) == 0) {
    ep.path = rest.substr(5);
    if (ep.path.empty()) return make_error("empty unix socket path in '" + s + "'");
    return ep;
  }
  if (!rest.empty() && (rest[0] == '/' || rest[0] == '.')) {
    ep.path = rest;
    return ep;
  }
  if (rest.rfind("tcp:", 0) == 0) rest = rest.substr(4);
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return make_error("'" + s + "' is not an endpoint (unix:/path, /path or host:port)");
  }
  ep.is_unix = false;
  ep.host = rest.substr(0, colon);
  if (ep.host.size() > 2 && ep.host.front() == '[' && ep.host.back() == ']')
    ep.host = ep.host.substr(1, ep.host.size() - 2);
  std::string port = rest.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 0 || p > 65535) return make_error("bad port in '" + s + "'");
  ep.port = static_cast<uint16_t>(p);
  return ep;
}

std::vector<std::string> split_endpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t from = 0;
  while (from <= list.size()) {
    size_t comma = list.find(',', from);
    std::string one =
        trim(list.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (!one.empty()) out.push_back(std::move(one));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

namespace detail {

Result<std::vector<char>> unix_address(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return make_error("socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  const char* p = reinterpret_cast<const char*>(&sa);
  return std::vector<char>(p, p + sizeof sa);
}

// A numeric address needs no resolver.
std::optional<std::vector<char>> numeric_address(const std::string& host, uint16_t port) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &in.sin_addr) == 1) {
    const char* p = reinterpret_cast<const char*>(&in);
    return std::vector<char>(p, p + sizeof in);
  }
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(port);
  if (inet_pton(AF_INET6, host.c_str(), &in6.sin6_addr) == 1) {
    const char* p = reinterpret_cast<const char*>(&in6);
    return std::vector<char>(p, p + sizeof in6);
  }
  return std::nullopt;
}

Result<std::vector<std::vector<char>>> resolve_blocking(const std::string& host, uint16_t port) {
  if (auto n = numeric_address(host, port)) return std::vector<std::vector<char>>{*n};
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string ps = std::to_string(port);
  int r = ::getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (r != 0) return make_error("resolve " + host + ": " + gai_strerror(r));
  std::vector<std::vector<char>> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const char* p = reinterpret_cast<const char*>(ai->ai_addr);
    out.emplace_back(p, p + ai->ai_addrlen);
  }
  ::freeaddrinfo(res);
  if (out.empty()) return make_error("no address for " + host);
  return out;
}

// Starts a non-blocking connect; the fd is connected or connecting (EINPROGRESS).
Result<Fd> start_connect(const std::vector<char>& addr, bool* in_progress) {
  auto* sa = reinterpret_cast<const sockaddr*>(addr.data());
  Fd fd(::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return sys_error("socket");
  *in_progress = false;
  if (::connect(fd.get(), sa, static_cast<socklen_t>(addr.size())) < 0) {
    if (errno != EINPROGRESS) return sys_error("connect");
    *in_progress = true;
  }
  if (sa->sa_family != AF_UNIX) {
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

std::string endpoint_name(const Endpoint& ep) {
  return ep.is_unix ? ep.path : ep.host + ":" + std::to_string(ep.port);
}

}  // namespace detail

using namespace detail;

Result<Fd> connect_endpoint(const Endpoint& ep, int timeout_ms) {
  std::vector<std::vector<char>> addrs;
  if (ep.is_unix) {
    TRY_ASSIGN(auto a, unix_address(ep.path));
    addrs.push_back(std::move(a));
  } else {
    TRY_ASSIGN(addrs, resolve_blocking(ep.host, ep.port));
  }
  Error last = make_error("no address for " + endpoint_name(ep));
  uint64_t deadline = now_monotonic_us() + static_cast<uint64_t>(timeout_ms) * 1000;
  for (const auto& a : addrs) {
    bool in_progress = false;
    auto fd = start_connect(a, &in_progress);
    if (!fd.ok()) {
      last = std::move(fd).error().wrap("connect to " + endpoint_name(ep));
      continue;
    }
    if (!in_progress) return fd;
    for (;;) {
      uint64_t now = now_monotonic_us();
      if (now >= deadline)
        return make_error("connect to " + endpoint_name(ep) + " timed out").with_code(kTimeout);
      pollfd p{fd->get(), POLLOUT, 0};
      int r = ::poll(&p, 1, static_cast<int>((deadline - now) / 1000) + 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd->get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) return fd;
    last = errno_error(err, "connect to " + endpoint_name(ep));
  }
  return last;
}

// ---- Client ----

Result<std::unique_ptr<Client>> Client::connect(const std::string& endpoint, size_t max_line,
                                                const ClientTls* tls, int timeout_ms) {
  std::string rest = endpoint;
  bool want_tls = rest.rfind("tls://", 0) == 0;
  if (want_tls) rest = rest.substr(6);
  TRY_ASSIGN(Endpoint ep, parse_endpoint(rest));
  if (want_tls && (ep.is_unix || !tls || !tls->open))
    return make_error("'" + endpoint +
                      "' needs a TLS certificate, key and CA bundle (a tls:// endpoint is TCP)");
  TRY_ASSIGN(Fd fd, connect_endpoint(ep, timeout_ms));
  std::unique_ptr<Client> c(new Client(std::move(fd), max_line));
  if (!ep.is_unix && tls && tls->open) {
    TRY_ASSIGN(c->stream_,
               tls->open(c->fd_.get(), tls->server_name.empty() ? ep.host : tls->server_name));
    TRY_CTX(c->handshake(rest, timeout_ms), "TLS with " + rest);
  }
  return c;
}

Client::~Client() = default;

namespace {

// Waits for the socket as a TLS step asked; false once `deadline` passed.
bool wait_for(int fd, tls::Want w, uint64_t deadline) {
  uint64_t now = now_monotonic_us();
  if (now >= deadline) return false;
  pollfd p{fd, static_cast<short>(w == tls::Want::kWrite ? POLLOUT : POLLIN), 0};
  int r = ::poll(&p, 1, static_cast<int>((deadline - now) / 1000) + 1);
  return r >= 0 || errno == EINTR;
}

}  // namespace

Status Client::handshake(const std::string& server, int timeout_ms) {
  uint64_t deadline = now_monotonic_us() + static_cast<uint64_t>(timeout_ms) * 1000;
  for (;;) {
    std::string why;
    tls::Want w = stream_->handshake(&why);
    if (w == tls::Want::kDone) break;
    if (w == tls::Want::kClosed)
      return make_error(
                 "the server closed the connection during the handshake (does it "
                 "accept this certificate?)")
          .with_code(kUnavailable);
    if (w == tls::Want::kError) return make_error(why).with_code(kUnavailable);
    if (!wait_for(fd_.get(), w, deadline))
      return make_error("handshake timed out after " + std::to_string(timeout_ms) + " ms")
          .with_code(kTimeout);
  }
  server_peer_.tls = true;
  server_peer_.address = server;
  server_peer_.identity = stream_->peer_identity();
  resumed_ = stream_->resumed();
  return {};
}

Result<size_t> Client::read_some(char* buf, size_t n) {
  if (!stream_) {
    ssize_t r = ::read(fd_.get(), buf, n);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) return size_t{0};
      return sys_error("read");
    }
    if (r == 0) return make_error("connection closed by server").with_code(kUnavailable);
    return static_cast<size_t>(r);
  }
  size_t got = 0;
  std::string why;
  switch (stream_->read(buf, n, &got, &why)) {
    case tls::Want::kDone:
      return got;
    case tls::Want::kRead:
    case tls::Want::kWrite:
      return size_t{0};
    case tls::Want::kClosed:
      return make_error("connection closed by server").with_code(kUnavailable);
    case tls::Want::kError:
      break;
  }
  return make_error("TLS: " + why).with_code(kUnavailable);
}

Status Client::send_line(const std::string& line) {
  size_t off = 0;
  uint64_t deadline = now_monotonic_us() + 30'000'000;
  while (off < line.size()) {
    if (stream_) {
      size_t put = 0;
      std::string why;
      tls::Want w = stream_->write(line.data() + off, line.size() - off, &put, &why);
      if (w == tls::Want::kDone) {
        off += put;
        continue;
      }
      if (w == tls::Want::kClosed)
        return make_error("connection closed by server").with_code(kUnavailable);
      if (w == tls::Want::kError) return make_error("TLS: " + why).with_code(kUnavailable);
      if (!wait_for(fd_.get(), w, deadline))
        return make_error("send timed out").with_code(kTimeout);
      continue;
    }
    ssize_t n = ::send(fd_.get(), line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        if (!wait_for(fd_.get(), tls::Want::kWrite, deadline))
          return make_error("send timed out").with_code(kTimeout);
        continue;
      }
      return sys_error("send");
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

Status Client::notify(const std::string& method, json params) {
  if (params.is_null()) params = json::object();
  json msg{{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
  return send_line(msg.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
}

Status Client::serve(const json& msg) {
  // A request from the server while we wait: answer it (a notification: handle it).
  const Handler* h = dispatcher_ && msg["method"].is_string()
                         ? dispatcher_->find(msg["method"].get<std::string>())
                         : nullptr;
  if (!msg.contains("id")) {
    auto pit = msg.find("params");
    if (h) {
      try {
        (void)(*h)(pit != msg.end() && pit->is_object() ? *pit : json::object(),
                   CallContext{nullptr, server_peer_});
      } catch (const std::exception&) {
      }
    }
    return {};
  }
  json reply{{"jsonrpc", "2.0"}, {"id", msg["id"]}};
  if (!h) {
    reply["error"] = error_object({kMethodNotFound, "unknown method", {}});
  } else {
    auto pit = msg.find("params");
    json call_params = pit != msg.end() && pit->is_object() ? *pit : json::object();
    Result<json> r = make_error("internal error");
    try {
      r = (*h)(call_params, CallContext{nullptr, server_peer_});
    } catch (const std::exception& e) {
      r = make_error(std::string("internal error: ") + e.what()).with_code(kInternalError);
    }
    if (r.ok())
      reply["result"] = *r;
    else
      reply["error"] = error_object(to_rpc_error(r.error()));
  }
  return send_line(reply.dump() + "\n");
}

Result<std::optional<json>> Client::next_message(const char* overflow) {
  std::string line;
  for (;;) {
    auto kind = reader_.next(&line);
    if (kind == LineReader::Kind::kNone) return std::optional<json>();
    if (kind == LineReader::Kind::kOverflow) return make_error(overflow);
    auto parsed = parse_json_bounded(line);
    if (parsed.ok() && parsed->is_object()) return std::optional<json>(std::move(parsed).value());
  }
}

Status Client::pump() {
  for (;;) {
    for (;;) {
      TRY_ASSIGN(std::optional<json> msg,
                 next_message("a message exceeds the maximum line length"));
      if (!msg) break;
      if (msg->contains("method")) TRY(serve(*msg));
    }
    char buf[65536];
    TRY_ASSIGN(size_t n, read_some(buf, sizeof buf));
    if (n == 0) return {};
    reader_.feed(buf, n);
  }
}

Result<json> Client::call(const std::string& method, json params, int timeout_ms) {
  if (params.is_null()) params = json::object();
  int64_t id = next_id_++;
  json req{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
  TRY(send_line(req.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"));
  uint64_t deadline = now_monotonic_us() + static_cast<uint64_t>(timeout_ms) * 1000;
  for (;;) {
    for (;;) {
      TRY_ASSIGN(std::optional<json> next, next_message("reply exceeds the maximum line length"));
      if (!next) break;
      const json& msg = *next;
      if (msg.contains("method")) {
        TRY(serve(msg));
        continue;
      }
      if (!msg.contains("id") || msg["id"] != id) continue;
      auto err = msg.find("error");
      if (err != msg.end() && !err->is_null()) return from_rpc_error(error_from_json(*err));
      auto res = msg.find("result");
      return res != msg.end() ? *res : json();
    }
    char buf[65536];
    TRY_ASSIGN(size_t n, read_some(buf, sizeof buf));
    if (n > 0) {
      reader_.feed(buf, n);
      continue;
    }
    uint64_t now = now_monotonic_us();
    if (now >= deadline)
      return make_error("timed out waiting for reply to " + method).with_code(kTimeout);
    pollfd p{fd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>((deadline - now) / 1000) + 1);
    if (r < 0 && errno != EINTR) return sys_error("poll");
  }
}

}  // namespace weft::rpc
