#include "common/rpc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/log.h"

namespace weft::rpc {

RpcError to_rpc_error(const Error& e, int fallback) {
  RpcError r;
  r.code = e.code != 0 ? e.code : (!e.field.empty() ? kInvalidParams : fallback);
  r.message = e.str();
  if (!e.field.empty()) r.data = json{{"field", e.field}};
  return r;
}

Error from_rpc_error(const RpcError& e) {
  // The message already names the field (to_rpc_error put it there), so `field` stays
  // empty and str() does not repeat it.
  Error err = make_error(e.message);
  err.code = e.code;
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

// ---- Session ----

Session::Session(EventLoop& loop, Fd fd, Peer peer, const Dispatcher* dispatcher, size_t max_line)
    : loop_(loop),
      fd_(std::move(fd)),
      peer_(std::move(peer)),
      dispatcher_(dispatcher),
      reader_(max_line) {}

Session::~Session() {
  io_.reset();
  // Fail calls still waiting for a reply, without running on_close again.
  auto pending = std::move(pending_);
  for (auto& [id, fn] : pending) fn(make_error("session closed").with_code(kUnavailable));
}

Status Session::start() {
  TRY_ASSIGN(io_, loop_.add_io(fd_.get(), EPOLLIN, [this](uint32_t ev) { on_io(ev); }));
  return {};
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  io_.reset();
  ::shutdown(fd_.get(), SHUT_RDWR);
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, fn] : pending) fn(make_error("session closed").with_code(kUnavailable));
  auto watchers = std::move(close_watchers_);
  for (auto& w : watchers) w();
  if (on_close_) {
    auto fn = std::move(on_close_);
    fn();  // may schedule destruction of this session
  }
}

void Session::on_io(uint32_t revents) {
  if (revents & EPOLLOUT) flush();
  if (closed_) return;
  if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(fd_.get(), buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        close();
        return;
      }
      if (n == 0) {
        close();
        return;
      }
      reader_.feed(buf, static_cast<size_t>(n));
      std::string line;
      for (;;) {
        auto kind = reader_.next(&line);
        if (kind == LineReader::Kind::kNone) break;
        if (kind == LineReader::Kind::kOverflow) {
          reply_error(nullptr, {kLineTooLong, "line exceeds the maximum length", {}});
          continue;
        }
        handle_line(line);
        if (closed_) return;
      }
      if (static_cast<size_t>(n) < sizeof buf) break;
    }
  }
}

void Session::reply_error(const json& id, const RpcError& e) {
  send_json(json{{"jsonrpc", "2.0"}, {"id", id}, {"error", error_object(e)}});
}

void Session::handle_line(const std::string& line) {
  if (line.find_first_not_of(" \t") == std::string::npos) return;  // blank lines are ignored
  json msg = json::parse(line, nullptr, false);
  if (msg.is_discarded()) {
    reply_error(nullptr, {kParseError, "parse error: not valid JSON", {}});
    return;
  }
  if (!msg.is_object()) {
    reply_error(nullptr, {kInvalidRequest, "a message must be a JSON object", {}});
    return;
  }
  if (!msg.contains("method") && (msg.contains("result") || msg.contains("error"))) {
    handle_response(msg);
    return;
  }
  json id = msg.contains("id") ? msg["id"] : json();
  bool is_notification = !msg.contains("id");
  if (msg.contains("id") && !(id.is_string() || id.is_number_integer() || id.is_null())) {
    reply_error(nullptr,
                {kInvalidRequest, "id must be a string or an integer", json{{"field", "id"}}});
    return;
  }
  if (msg.value("jsonrpc", "") != "2.0") {
    if (!is_notification)
      reply_error(id, {kInvalidRequest, "jsonrpc must be \"2.0\"", json{{"field", "jsonrpc"}}});
    return;
  }
  if (!msg.contains("method") || !msg["method"].is_string()) {
    if (!is_notification)
      reply_error(id, {kInvalidRequest, "method must be a string", json{{"field", "method"}}});
    return;
  }
  std::string method = msg["method"];
  json params = msg.contains("params") && !msg["params"].is_null() ? msg["params"] : json::object();
  if (!params.is_object() && !params.is_array()) {
    if (!is_notification)
      reply_error(id, {kInvalidRequest, "params must be an object", json{{"field", "params"}}});
    return;
  }
  const Handler* h = dispatcher_ ? dispatcher_->find(method) : nullptr;
  if (!h) {
    if (!is_notification) reply_error(id, {kMethodNotFound, "unknown method '" + method + "'", {}});
    return;
  }
  Result<json> result = make_error("internal error");
  try {
    result = (*h)(params, CallContext{this, peer_});
  } catch (const std::exception& e) {
    // Handlers validate their params; this is the last line so a bug in one request
    // cannot take the daemon down.
    log_error("handler threw", {{"METHOD", method}, {"WHAT", e.what()}});
    result = make_error(std::string("internal error: ") + e.what()).with_code(kInternalError);
  }
  if (is_notification || closed_) return;
  if (result.ok()) {
    send_json(json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result).value()}});
  } else {
    reply_error(id, to_rpc_error(result.error()));
  }
}

void Session::handle_response(const json& msg) {
  if (!msg.contains("id") || !msg["id"].is_number_integer()) return;  // not ours
  auto it = pending_.find(msg["id"].get<int64_t>());
  if (it == pending_.end()) return;
  ReplyFn fn = std::move(it->second);
  pending_.erase(it);
  if (msg.contains("error") && msg["error"].is_object()) {
    const json& e = msg["error"];
    RpcError re{e.value("code", static_cast<int>(kInternalError)), e.value("message", ""),
                e.contains("data") ? e["data"] : json()};
    fn(from_rpc_error(re));
  } else {
    fn(msg.contains("result") ? msg["result"] : json());
  }
}

void Session::call(const std::string& method, json params, ReplyFn on_reply) {
  if (closed_) {
    on_reply(make_error("session closed").with_code(kUnavailable));
    return;
  }
  if (params.is_null()) params = json::object();
  int64_t id = next_id_++;
  pending_[id] = std::move(on_reply);
  send_json(
      json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}});
}

void Session::notify(const std::string& method, json params) {
  if (params.is_null()) params = json::object();
  send_json(json{{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}});
}

void Session::send_json(const json& msg) {
  if (closed_) return;
  out_ += msg.dump(-1, ' ', false, json::error_handler_t::replace);
  out_ += '\n';
  flush();
}

void Session::flush() {
  while (!out_.empty()) {
    ssize_t n = ::send(fd_.get(), out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      close();
      return;
    }
    out_.erase(0, static_cast<size_t>(n));
  }
  if (out_.size() > (64u << 20)) {  // a peer that never reads cannot make us grow forever
    log_warn("closing session: peer is not reading", {{"PEER", peer_.address}});
    close();
    return;
  }
  bool want_out = !out_.empty();
  if (!closed_ && io_.active() && want_out != want_out_) {
    want_out_ = want_out;
    (void)io_.set_io_events(want_out ? (EPOLLIN | EPOLLOUT) : EPOLLIN);
  }
}

// ---- Access ----

Status require_privileged(const Peer& peer, int gid, const std::string& group_name,
                          const HostPaths& host, const std::string& action) {
  if (!peer.is_unix) return make_error("permission denied").with_code(kPermissionDenied);
  if (peer.uid == 0 || peer.uid == ::getuid()) return {};
  if (gid >= 0) {
    if (peer.gid == static_cast<gid_t>(gid)) return {};
    auto status = read_file(host.proc(std::to_string(peer.pid) + "/status"));
    if (status.ok()) {
      for (const auto& line : split(*status, '\n')) {
        if (line.rfind("Groups:", 0) != 0) continue;
        for (const auto& g : split(trim(line.substr(7)), ' '))
          if (!g.empty() && std::atoi(g.c_str()) == gid) return {};
      }
    }
  }
  return make_error("permission denied: " + action + " needs root or membership in group '" +
                    group_name + "'")
      .with_code(kPermissionDenied);
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

static Status set_nonblock_cloexec(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return sys_error("fcntl");
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return {};
}

Result<Fd> connect_endpoint(const Endpoint& ep) {
  if (ep.is_unix) {
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (ep.path.size() >= sizeof sa.sun_path) return make_error("socket path too long: " + ep.path);
    std::memcpy(sa.sun_path, ep.path.c_str(), ep.path.size() + 1);
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return sys_error("socket");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0)
      return sys_error("connect to " + ep.path);
    TRY(set_nonblock_cloexec(fd.get()));
    return fd;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(ep.port);
  int r = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
  if (r != 0) return make_error("resolve " + ep.host + ": " + gai_strerror(r));
  Error last = make_error("no address for " + ep.host);
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) continue;
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
      ::freeaddrinfo(res);
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      TRY(set_nonblock_cloexec(fd.get()));
      return fd;
    }
    last = sys_error("connect to " + ep.host + ":" + port);
  }
  ::freeaddrinfo(res);
  return last;
}

// ---- Server ----

Server::~Server() {
  sessions_.clear();
  listeners_.clear();
  for (const auto& p : unix_paths_) ::unlink(p.c_str());
}

Status Server::listen_unix(const std::string& path, mode_t mode, int group_gid) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return make_error("socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return sys_error("socket");
  TRY(mkdir_p(dirname_of(path), 0755));
  // A socket file left by a killed predecessor: replace it, but never steal a live one.
  if (path_exists(path)) {
    auto probe = connect_endpoint(Endpoint{true, path, "", 0});
    if (probe.ok()) return make_error("another process is already serving " + path);
    ::unlink(path.c_str());
  }
  mode_t old = ::umask(0177);
  int r = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  ::umask(old);
  if (r < 0) return sys_error("bind " + path);
  if (group_gid >= 0 &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(group_gid)) < 0)
    return sys_error("chown " + path);
  if (::chmod(path.c_str(), mode) < 0) return sys_error("chmod " + path);
  if (::listen(fd.get(), 512) < 0) return sys_error("listen " + path);
  int lfd = fd.get();
  TRY_ASSIGN(Source src,
             loop_.add_io(lfd, EPOLLIN, [this, lfd](uint32_t) { accept_on(lfd, true); }));
  listeners_.emplace_back(std::move(fd), std::move(src));
  unix_paths_.push_back(path);
  return {};
}

Status Server::listen_tcp(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string ps = std::to_string(port);
  int r = ::getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (r != 0) return make_error("resolve " + host + ": " + gai_strerror(r));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  Fd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return sys_error("socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) < 0)
    return sys_error("bind " + host + ":" + ps);
  if (::listen(fd.get(), 512) < 0) return sys_error("listen");
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl);
  tcp_port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  int lfd = fd.get();
  TRY_ASSIGN(Source src,
             loop_.add_io(lfd, EPOLLIN, [this, lfd](uint32_t) { accept_on(lfd, false); }));
  listeners_.emplace_back(std::move(fd), std::move(src));
  return {};
}

void Server::accept_on(int lfd, bool is_unix) {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    int c = ::accept4(lfd, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) log_warn(std::string("accept failed: ") + std::strerror(errno));
      return;
    }
    Fd fd(c);
    Peer peer;
    peer.is_unix = is_unix;
    if (is_unix) {
      ucred cred{};
      socklen_t cl = sizeof cred;
      if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
        peer.pid = cred.pid;
        peer.uid = cred.uid;
        peer.gid = cred.gid;
      }
      peer.address = "unix";
    } else {
      char host[INET6_ADDRSTRLEN] = "?";
      uint16_t port = 0;
      if (ss.ss_family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
      }
      peer.address = std::string(host) + ":" + std::to_string(port);
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    auto s = std::make_unique<Session>(loop_, std::move(fd), peer, dispatcher_, max_line_);
    Session* raw = s.get();
    raw->set_on_close([this] {
      // Free closed sessions outside of their own callbacks.
      if (!reaper_.active()) {
        auto d = loop_.add_defer([this] { reap(); });
        if (d.ok()) reaper_ = std::move(d).value();
      }
    });
    if (!raw->start().ok()) continue;
    sessions_[raw] = std::move(s);
    if (on_session) on_session(*raw);
  }
}

void Server::reap() {
  reaper_.reset();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->first->closed())
      it = sessions_.erase(it);
    else
      ++it;
  }
}

// ---- Client ----

Result<std::unique_ptr<Client>> Client::connect(const std::string& endpoint, size_t max_line) {
  TRY_ASSIGN(Endpoint ep, parse_endpoint(endpoint));
  TRY_ASSIGN(Fd fd, connect_endpoint(ep));
  return std::unique_ptr<Client>(new Client(std::move(fd), max_line));
}

Status Client::send_line(const std::string& line) {
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::send(fd_.get(), line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd_.get(), POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return sys_error("send");
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

Result<json> Client::call(const std::string& method, json params, int timeout_ms) {
  if (params.is_null()) params = json::object();
  int64_t id = next_id_++;
  json req{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
  TRY(send_line(req.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"));
  uint64_t deadline = now_monotonic_us() + static_cast<uint64_t>(timeout_ms) * 1000;
  for (;;) {
    std::string line;
    for (;;) {
      auto kind = reader_.next(&line);
      if (kind == LineReader::Kind::kNone) break;
      if (kind == LineReader::Kind::kOverflow)
        return make_error("reply exceeds the maximum line length");
      json msg = json::parse(line, nullptr, false);
      if (!msg.is_object()) continue;
      if (msg.contains("method")) {
        // A request from the server while we wait: answer it.
        if (!msg.contains("id")) continue;
        json reply{{"jsonrpc", "2.0"}, {"id", msg["id"]}};
        const Handler* h = dispatcher_ && msg["method"].is_string()
                               ? dispatcher_->find(msg["method"].get<std::string>())
                               : nullptr;
        if (!h) {
          reply["error"] = error_object({kMethodNotFound, "unknown method", {}});
        } else {
          auto r = (*h)(msg.value("params", json::object()), CallContext{nullptr, server_peer_});
          if (r.ok())
            reply["result"] = *r;
          else
            reply["error"] = error_object(to_rpc_error(r.error()));
        }
        TRY(send_line(reply.dump() + "\n"));
        continue;
      }
      if (!msg.contains("id") || msg["id"] != id) continue;
      if (msg.contains("error")) {
        const json& e = msg["error"];
        RpcError re{e.value("code", static_cast<int>(kInternalError)), e.value("message", ""),
                    e.contains("data") ? e["data"] : json()};
        return from_rpc_error(re);
      }
      return msg.contains("result") ? msg["result"] : json();
    }
    uint64_t now = now_monotonic_us();
    if (now >= deadline)
      return make_error("timed out waiting for reply to " + method).with_code(kTimeout);
    pollfd p{fd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>((deadline - now) / 1000) + 1);
    if (r < 0 && errno != EINTR) return sys_error("poll");
    if (r <= 0) continue;
    char buf[65536];
    ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return sys_error("read");
    }
    if (n == 0) return make_error("connection closed by server").with_code(kUnavailable);
    reader_.feed(buf, static_cast<size_t>(n));
  }
}

}  // namespace weft::rpc
