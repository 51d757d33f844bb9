#include "common/rpc/client.h"
#include "common/rpc/server.h"

#include <openssl/ssl.h>

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

#include <sys/resource.h>

#include <cstring>
#include <thread>
#include <utility>

#include <simdjson.h>

#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc_detail.h"

namespace weft::rpc {

using namespace detail;

// ---- Session ----

Session::Session(EventLoop& loop, Fd fd, Peer peer, const Dispatcher* dispatcher, size_t max_line,
                 std::shared_ptr<BufferBudget> budget)
    : loop_(loop),
      fd_(std::move(fd)),
      peer_(std::move(peer)),
      dispatcher_(dispatcher),
      reader_(max_line),
      budget_(std::move(budget)) {}

void OutputGate::release() {
  held_ = false;
  auto waiting = std::exchange(waiting_, {});
  for (Session* s : waiting) {
    s->gate_waiting_ = false;
    s->ungate(UINT64_MAX);
  }
}

void OutputGate::release_through(uint64_t e) {
  auto waiting = std::exchange(waiting_, {});
  for (Session* s : waiting) {
    s->gate_waiting_ = false;
    s->ungate(e);
    if (!s->gated_.empty() && !std::exchange(s->gate_waiting_, true)) waiting_.push_back(s);
  }
}

void Session::ungate(uint64_t e) {
  while (!gated_.empty() && gated_.front().first <= e) {
    gated_bytes_ -= gated_.front().second.size();
    out_ += gated_.front().second;
    gated_.pop_front();
  }
  flush();
}

Session::~Session() {
  *self_ = nullptr;
  if (gate_waiting_) std::erase(gate_->waiting_, this);
  io_.reset();
  if (ssl_ && established_ && !closed_) tls::shutdown(ssl_.get());
  if (budget_) budget_->used -= accounted_;
  // Fail calls still waiting for a reply, without running on_close again.
  auto pending = std::move(pending_);
  for (auto& [id, fn] : pending) fn(make_error("session closed").with_code(kUnavailable));
}

void Session::use_tls(SSL* ssl, uint64_t handshake_timeout_us) {
  ssl_.reset(ssl);
  handshake_timeout_us_ = handshake_timeout_us;
}

Status Session::start() {
  // Edge-triggered: every handler reads until the socket is drained and writes until it
  // is full, so a ready socket is reported once, not by every wait of the loop (with
  // thousands of sessions, level-triggered waits cost O(ready sessions) per dispatch).
  last_heard_us_ = now_monotonic_us();
  TRY_ASSIGN(io_, loop_.add_io(fd_.get(), EPOLLIN | EPOLLET, [this](uint32_t ev) { on_io(ev); }));
  if (ssl_) {
    TRY_ASSIGN(handshake_timer_, loop_.add_timer_in(handshake_timeout_us_, [this] {
      if (established_ || closed_) return;
      log_warn("closing session: TLS handshake not finished in time", {{"PEER", peer_.address}});
      close();
    }));
    // A client speaks first: start the handshake now rather than on the first event.
    handshake();
    update_events();
  }
  return {};
}

bool Session::handshake() {
  if (established_) return true;
  std::string why;
  switch (tls::handshake(ssl_.get(), &why)) {
    case tls::Want::kDone:
      established_ = true;
      tls_wants_write_ = false;
      handshake_timer_.reset();
      peer_.tls = true;
      peer_.identity = tls::peer_identity(ssl_.get());
      if (on_established_) {
        auto fn = std::move(on_established_);
        fn();
      }
      if (closed_) return false;
      flush();  // what was queued before
      return !closed_;
    case tls::Want::kRead:
      tls_wants_write_ = false;
      return false;
    case tls::Want::kWrite:
      tls_wants_write_ = true;
      return false;
    case tls::Want::kClosed:
    case tls::Want::kError:
      log_warn("TLS handshake failed",
               {{"PEER", peer_.address}, {"ERROR", why.empty() ? "connection closed" : why}});
      close();
      return false;
  }
  return false;
}

void Session::update_events() {
  if (closed_ || !io_.active()) return;
  // Output held by the gate is not wanted out yet: no EPOLLOUT (a writable socket would
  // wake the loop for nothing, again and again).
  // Output the gate holds is in gated_, not out_: a writable socket is wanted only for
  // what may be sent (else it would wake the loop for nothing, again and again).
  bool want_out = !out_.empty() || tls_wants_write_;
  if (ssl_ && !established_) want_out = tls_wants_write_;
  if (want_out != want_out_) {
    want_out_ = want_out;
    (void)io_.set_io_events(want_out ? (EPOLLIN | EPOLLOUT | EPOLLET) : (EPOLLIN | EPOLLET));
  }
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  io_.reset();
  handshake_timer_.reset();
  if (budget_) {
    budget_->used -= accounted_;
    accounted_ = 0;
  }
  if (ssl_ && established_) tls::shutdown(ssl_.get());
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
  if (ssl_ && !established_) {
    if (!handshake()) {
      update_events();
      return;
    }
  }
  if (revents & EPOLLOUT) flush();
  if (closed_) return;
  if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    if (ssl_)
      read_tls();
    else
      read_plain();
  }
  if (closed_) return;
  if (ssl_ && !out_.empty()) flush();  // a write that waited for the peer's data
  update_events();
}

void Session::feed(const char* data, size_t n) {
  reader_.feed(data, n);
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
  account_buffered();
}

void Session::read_plain() {
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
    feed(buf, static_cast<size_t>(n));
    if (closed_) return;
    if (static_cast<size_t>(n) < sizeof buf) break;
  }
}

void Session::read_tls() {
  char buf[65536];
  for (;;) {
    size_t got = 0;
    std::string why;
    switch (tls::read(ssl_.get(), buf, sizeof buf, &got, &why)) {
      case tls::Want::kDone:
        feed(buf, got);
        if (closed_) return;
        continue;  // the record layer may hold more than one read's worth
      case tls::Want::kRead:
        return;
      case tls::Want::kWrite:
        tls_wants_write_ = true;
        return;
      case tls::Want::kClosed:
        close();
        return;
      case tls::Want::kError:
        log_warn("closing session: TLS error", {{"PEER", peer_.address}, {"ERROR", why}});
        close();
        return;
    }
  }
}

void Session::account_buffered() {
  if (!budget_) return;
  size_t now = reader_.buffered();
  budget_->used = budget_->used - accounted_ + now;
  accounted_ = now;
  if (now > 0 && budget_->used > budget_->limit) {
    log_warn("closing session: unfinished input lines of all sessions exceed the limit",
             {{"PEER", peer_.address}, {"BUFFERED", std::to_string(now)}});
    reply_error(nullptr, {kUnavailable, "server busy: too much unfinished input", {}});
    close();
  }
}

namespace {

json error_reply(const json& id, const RpcError& e) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"error", error_object(e)}};
}

}  // namespace

void Session::reply_error(const json& id, const RpcError& e) {
  send_json(error_reply(id, e));
}

void Session::handle_line(const std::string& line) {
  if (line.find_first_not_of(" \t") == std::string::npos) return;  // blank lines are ignored
  last_heard_us_ = now_monotonic_us();
  // No exception may reach the event loop: every access below checks types, and this is
  // the last line of defence for a bug in that.
  try {
    if (dispatcher_ && dispatcher_->has_raw() && handle_raw(line)) return;
    auto parsed = parse_json_bounded(line);
    if (!parsed.ok()) {
      reply_error(nullptr, {kParseError, "parse error: " + parsed.error().str(), {}});
      return;
    }
    const json& msg = *parsed;
    if (msg.is_array()) {
      if (msg.empty()) {
        reply_error(nullptr, {kInvalidRequest, "a batch must not be empty", {}});
        return;
      }
      if (msg.size() > kMaxBatch) {
        reply_error(nullptr, {kInvalidRequest,
                              "a batch holds at most " + std::to_string(kMaxBatch) + " requests",
                              {}});
        return;
      }
      json replies = json::array();
      for (const auto& one : msg) {
        auto r = handle_message(one);
        if (closed_) return;
        if (r) replies.push_back(std::move(*r));
      }
      if (!replies.empty()) send_json(replies);
      return;
    }
    auto r = handle_message(msg);
    if (r && !closed_) send_json(*r);
  } catch (const std::exception& e) {
    log_error("request failed unexpectedly", {{"PEER", peer_.address}, {"WHAT", e.what()}});
    reply_error(nullptr, {kInternalError, "internal error", {}});
  }
}

std::optional<json> Session::handle_message(const json& msg) {
  if (!msg.is_object())
    return error_reply(nullptr, {kInvalidRequest, "a message must be a JSON object", {}});
  auto method_it = msg.find("method");
  if (method_it == msg.end() && (msg.contains("result") || msg.contains("error"))) {
    handle_response(msg);
    return std::nullopt;
  }
  auto id_it = msg.find("id");
  bool is_notification = id_it == msg.end();
  json id = is_notification ? json() : *id_it;
  if (!is_notification && !(id.is_string() || id.is_number_integer() || id.is_null()))
    return error_reply(
        nullptr, {kInvalidRequest, "id must be a string or an integer", json{{"field", "id"}}});
  auto version = msg.find("jsonrpc");
  if (version == msg.end() || !version->is_string() ||
      version->get_ref<const std::string&>() != "2.0") {
    if (is_notification) return std::nullopt;
    return error_reply(id,
                       {kInvalidRequest, "jsonrpc must be \"2.0\"", json{{"field", "jsonrpc"}}});
  }
  if (method_it == msg.end() || !method_it->is_string()) {
    if (is_notification) return std::nullopt;
    return error_reply(id, {kInvalidRequest, "method must be a string", json{{"field", "method"}}});
  }
  const std::string& method = method_it->get_ref<const std::string&>();
  auto params_it = msg.find("params");
  static const json kNoParams = json::object();
  const json& params = params_it != msg.end() && !params_it->is_null() ? *params_it : kNoParams;
  if (!params.is_object() && !params.is_array()) {
    if (is_notification) return std::nullopt;
    return error_reply(id,
                       {kInvalidRequest, "params must be an object", json{{"field", "params"}}});
  }
  const Handler* h = dispatcher_ ? dispatcher_->find(method) : nullptr;
  if (!h) {
    if (is_notification) return std::nullopt;
    std::string shown = method.size() > 64 ? method.substr(0, 64) + "..." : method;
    return error_reply(id, {kMethodNotFound, "unknown method '" + shown + "'", {}});
  }
  Result<json> result = make_error("internal error");
  handling_id_ = is_notification ? nullptr : &id;
  deferred_ = false;
  try {
    result = (*h)(params, CallContext{this, peer_});
  } catch (const std::exception& e) {
    // Handlers validate their params; this is the last line so a bug in one request
    // cannot take the daemon down.
    log_error("handler threw", {{"METHOD", method}, {"WHAT", e.what()}});
    result = make_error(std::string("internal error: ") + e.what()).with_code(kInternalError);
  }
  handling_id_ = nullptr;
  if (is_notification || closed_ || deferred_) return std::nullopt;
  if (result.ok())
    return json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result).value()}};
  return error_reply(id, to_rpc_error(result.error()));
}

bool Session::handle_raw(const std::string& line) {
  namespace od = simdjson::ondemand;
  // Bounded as the usual path bounds it (a deep line is refused there, as a parse error).
  if (json_nesting_depth(line) > kMaxJsonDepth) return false;
  thread_local od::parser parser;
  simdjson::padded_string text(line);
  od::document doc;
  od::object obj;
  // One JSON value and nothing after it ("{...} {}" is the usual path's parse error).
  auto trimmed = [](std::string_view s) {
    while (!s.empty() &&
           (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
      s.remove_suffix(1);
    return s.size();
  };
  std::string_view whole;
  if (parser.iterate(text).get(doc) || doc.raw_json().get(whole) || trimmed(whole) != trimmed(line))
    return false;
  doc.rewind();
  if (doc.get_object().get(obj)) return false;
  std::string_view version, method, params;
  json id;
  bool has_id = false, has_version = false, has_method = false, has_params = false;
  for (auto member : obj) {
    od::field f;
    std::string_view key;
    if (std::move(member).get(f) || f.unescaped_key().get(key)) return false;
    od::value v = f.value();
    bool dup = false;
    if (key == "jsonrpc") {
      dup = std::exchange(has_version, true);
      if (v.get_string().get(version)) return false;
    } else if (key == "method") {
      dup = std::exchange(has_method, true);
      // (The view stays valid: the document's strings are unescaped one after another.)
      if (v.get_string().get(method)) return false;
    } else if (key == "id") {
      dup = std::exchange(has_id, true);
      od::json_type type;
      if (v.type().get(type)) return false;
      int64_t n;
      std::string_view s;
      if (type == od::json_type::number && !v.get_int64().get(n))
        id = n;
      else if (type == od::json_type::string && !v.get_string().get(s))
        id = std::string(s);
      else if (type == od::json_type::null)
        id = nullptr;
      else
        return false;
    } else if (key == "params") {
      dup = std::exchange(has_params, true);
      od::object p;
      if (v.get_object().get(p) || p.raw_json().get(params)) return false;
      // raw_json() runs to the next member (its spacing included); an object the
      // iterator could not delimit is the usual path's to refuse.
      params = params.substr(0, trimmed(params));
      if (params.size() < 2 || params.front() != '{' || params.back() != '}') return false;
    }
    if (dup) return false;
  }
  if (!has_version || version != "2.0" || !has_method) return false;
  const RawHandler* h = dispatcher_->find_raw(method);
  if (!h) return false;
  const bool is_notification = !has_id;
  Result<json> result = make_error("internal error");
  handling_id_ = is_notification ? nullptr : &id;
  deferred_ = false;
  try {
    result = (*h)(has_params ? params : std::string_view("{}"), CallContext{this, peer_});
  } catch (const std::exception& e) {
    log_error("handler threw", {{"METHOD", std::string(method)}, {"WHAT", e.what()}});
    result = make_error(std::string("internal error: ") + e.what()).with_code(kInternalError);
  }
  handling_id_ = nullptr;
  if (is_notification || closed_ || deferred_) return true;
  if (result.ok())
    send_json(json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result).value()}});
  else
    send_json(error_reply(id, to_rpc_error(result.error())));
  return true;
}

ReplyFn Session::defer_reply() {
  if (!handling_id_) return [](Result<json>) {};  // a notification: nothing to send
  deferred_ = true;
  json id = *handling_id_;
  std::weak_ptr<Session*> weak = self_;
  return [weak, id](Result<json> result) {
    auto self = weak.lock();
    if (!self || !*self || (*self)->closed_) return;
    Session* s = *self;
    if (result.ok())
      s->send_json(json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result).value()}});
    else
      s->send_json(error_reply(id, to_rpc_error(result.error())));
  };
}

void Session::handle_response(const json& msg) {
  auto id_it = msg.find("id");
  if (id_it == msg.end() || !id_it->is_number_integer()) return;  // not ours
  auto it = pending_.find(id_it->get<int64_t>());
  if (it == pending_.end()) return;
  ReplyFn fn = std::move(it->second);
  pending_.erase(it);
  auto err = msg.find("error");
  if (err != msg.end() && !err->is_null()) {
    fn(from_rpc_error(error_from_json(*err)));
  } else {
    auto res = msg.find("result");
    fn(res != msg.end() ? *res : json());
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

void Session::notify_serialized(const std::string& method, const std::string& params) {
  std::string line = "{\"jsonrpc\":\"2.0\",\"method\":" + json(method).dump() + ",\"params\":";
  line += params;
  line += "}\n";
  send_line(std::move(line));
}

void Session::send_json(const json& msg) {
  if (closed_) return;
  std::string line = msg.dump(-1, ' ', false, json::error_handler_t::replace);
  line += '\n';
  send_line(std::move(line));
}

void Session::call_serialized(const std::string& method, const std::string& params,
                              ReplyFn on_reply) {
  if (closed_) {
    on_reply(make_error("session closed").with_code(kUnavailable));
    return;
  }
  int64_t id = next_id_++;
  pending_[id] = std::move(on_reply);
  std::string line = "{\"jsonrpc\":\"2.0\",\"id\":" + std::to_string(id) +
                     ",\"method\":" + json(method).dump() + ",\"params\":";
  line += params;
  line += "}\n";
  send_line(std::move(line));
}

void Session::send_line(std::string line) {
  if (closed_) return;
  bytes_queued_ += line.size();
  if (gate_ && gate_->held()) {  // not yet durable: sent when its epoch is released
    uint64_t e = gate_->epoch();
    if (gated_.empty() || gated_.back().first != e) gated_.emplace_back(e, std::string());
    gated_.back().second += line;
    gated_bytes_ += line.size();
    if (!std::exchange(gate_waiting_, true)) gate_->waiting_.push_back(this);
    if (gated_bytes_ + out_.size() > (64u << 20)) {
      log_warn("closing session: peer is not reading", {{"PEER", peer_.address}});
      close();
    }
    return;
  }
  out_ += line;
  flush();
}

void Session::flush() {
  if (closed_) return;
  if (ssl_ && !established_) return;  // queued until the handshake completes
  tls_wants_write_ = false;
  while (!out_.empty()) {
    if (ssl_) {
      size_t put = 0;
      std::string why;
      tls::Want w = tls::write(ssl_.get(), out_.data(), out_.size(), &put, &why);
      if (w == tls::Want::kDone) {
        bytes_sent_ += put;
        out_.erase(0, put);
        continue;
      }
      if (w == tls::Want::kWrite) {
        tls_wants_write_ = true;
        break;
      }
      if (w == tls::Want::kRead) break;  // EPOLLIN is always on
      if (w == tls::Want::kError)
        log_warn("closing session: TLS error", {{"PEER", peer_.address}, {"ERROR", why}});
      close();
      return;
    }
    ssize_t n = ::send(fd_.get(), out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      close();
      return;
    }
    bytes_sent_ += static_cast<uint64_t>(n);
    out_.erase(0, static_cast<size_t>(n));
  }
  if (close_when_sent_ && out_.empty() && gated_.empty()) {
    close();
    return;
  }
  if (out_.size() > (64u << 20)) {  // a peer that never reads cannot make us grow forever
    log_warn("closing session: peer is not reading", {{"PEER", peer_.address}});
    close();
    return;
  }
  update_events();
}

// ---- Access ----

Status require_privileged(const Peer& peer, int gid, const std::string& group_name,
                          const std::string& action) {
  if (!peer.is_unix) return make_error("permission denied").with_code(kPermissionDenied);
  if (peer.uid == 0 || peer.uid == ::getuid()) return {};
  if (gid >= 0) {
    if (peer.gid == static_cast<gid_t>(gid)) return {};
    for (gid_t g : peer.groups)
      if (g == static_cast<gid_t>(gid)) return {};
  }
  return make_error("permission denied: " + action + " needs root or membership in group '" +
                    group_name + "'")
      .with_code(kPermissionDenied);
}

// ---- ConnectAttempt ----

struct ConnectAttempt::Resolve {
  Fd wake_r, wake_w;  // the thread writes one byte when `result` is set
  std::optional<Result<std::vector<std::vector<char>>>> result;
};

std::unique_ptr<ConnectAttempt> ConnectAttempt::start(EventLoop& loop, const Endpoint& ep,
                                                      uint64_t timeout_us, Done done) {
  std::unique_ptr<ConnectAttempt> a(new ConnectAttempt(loop, ep, std::move(done)));
  a->begin(timeout_us);
  return a;
}

ConnectAttempt::~ConnectAttempt() {
  io_.reset();
  timer_.reset();
  resolve_io_.reset();
  defer_.reset();
}

void ConnectAttempt::begin(uint64_t timeout_us) {
  auto t = loop_.add_timer_in(timeout_us, [this] {
    finish(make_error("connect to " + endpoint_name(ep_) + " timed out").with_code(kTimeout));
  });
  if (t.ok()) timer_ = std::move(t).value();
  if (ep_.is_unix) {
    auto a = unix_address(ep_.path);
    if (!a.ok()) return finish(std::move(a).error());
    addrs_.push_back(std::move(a).value());
  } else if (auto n = numeric_address(ep_.host, ep_.port)) {
    addrs_.push_back(std::move(*n));
  } else {
    // getaddrinfo blocks (DNS can take seconds): a helper thread does it.
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) return finish(sys_error("pipe"));
    resolve_ = std::make_shared<Resolve>();
    resolve_->wake_r.reset(p[0]);
    resolve_->wake_w.reset(p[1]);
    auto io = loop_.add_io(p[0], EPOLLIN, [this](uint32_t) { resolved(); });
    if (!io.ok()) return finish(std::move(io).error());
    resolve_io_ = std::move(io).value();
    try {
      std::thread([r = resolve_, host = ep_.host, port = ep_.port] {
        r->result = resolve_blocking(host, port);
        char one = 1;
        (void)!::write(r->wake_w.get(), &one, 1);
      }).detach();
    } catch (const std::system_error& e) {
      return finish(make_error(std::string("cannot start resolver thread: ") + e.what()));
    }
    return;
  }
  try_next();
}

void ConnectAttempt::resolved() {
  resolve_io_.reset();
  auto r = std::move(resolve_->result);
  resolve_.reset();
  if (!r || !r->ok()) return finish(r ? std::move(*r).error() : make_error("resolver failed"));
  addrs_ = std::move(**r);
  try_next();
}

void ConnectAttempt::try_next() {
  io_.reset();
  fd_.reset();
  while (next_ < addrs_.size()) {
    bool in_progress = false;
    auto fd = start_connect(addrs_[next_++], &in_progress);
    if (!fd.ok()) {
      last_ = std::move(fd).error().wrap("connect to " + endpoint_name(ep_));
      continue;
    }
    fd_ = std::move(fd).value();
    if (!in_progress) {
      // Connected at once (Unix sockets): report from the loop, not from start().
      auto d = loop_.add_defer([this] { finish(std::move(fd_)); });
      if (d.ok()) defer_ = std::move(d).value();
      return;
    }
    auto io = loop_.add_io(fd_.get(), EPOLLOUT, [this](uint32_t) { on_writable(); });
    if (!io.ok()) return finish(std::move(io).error());
    io_ = std::move(io).value();
    return;
  }
  finish(last_);
}

void ConnectAttempt::on_writable() {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == 0) return finish(std::move(fd_));
  last_ = errno_error(err, "connect to " + endpoint_name(ep_));
  try_next();
}

void ConnectAttempt::finish(Result<Fd> r) {
  if (!done_) return;
  io_.reset();
  timer_.reset();
  resolve_io_.reset();
  auto done = std::move(done_);
  done_ = nullptr;
  done(std::move(r));  // may destroy this
}

// ---- Server ----

Server::Server(EventLoop& loop, const Dispatcher* dispatcher, size_t max_line, ServerLimits limits)
    : loop_(loop),
      dispatcher_(dispatcher),
      max_line_(max_line),
      limits_(limits),
      budget_(std::make_shared<BufferBudget>()),
      spare_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
  budget_->limit = limits_.max_buffered_bytes;
  if (limits_.max_sessions == 0) {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    limits_.max_sessions = rl.rlim_cur > 128 ? static_cast<size_t>(rl.rlim_cur) - 64 : 64;
  }
}

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
  // A deep queue: after a control-plane restart every machine connects at once, and
  // connections wait here (no state in the daemon) while handshakes are capped.
  if (::listen(fd.get(), 4096) < 0) return sys_error("listen");
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl);
  tcp_port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  int lfd = fd.get();
  TRY_ASSIGN(Source src,
             loop_.add_io(lfd, EPOLLIN, [this, lfd](uint32_t) { accept_on(lfd, false); }));
  listeners_.emplace_back(std::move(fd), std::move(src));
  tcp_listeners_.push_back(listeners_.size() - 1);
  return {};
}

void Server::set_tcp_accepting(bool on) {
  if (accepting_tcp_ == on) return;
  accepting_tcp_ = on;
  for (size_t i : tcp_listeners_)
    (void)listeners_[i].second.set_io_events(on ? uint32_t{EPOLLIN} : 0u);
}

void Server::handshake_done() {
  --handshaking_;
  if (!accepting_tcp_ && handshaking_ < limits_.max_handshaking) set_tcp_accepting(true);
}

void Server::accept_on(int lfd, bool is_unix) {
  for (;;) {
    if (!is_unix && tls_ && handshaking_ >= limits_.max_handshaking) {
      // Enough unfinished handshakes: the rest wait in the kernel's queue (nothing held
      // for them here) until one finishes or times out.
      set_tcp_accepting(false);
      return;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    int c = ::accept4(lfd, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        size_t index = 0;
        while (index < listeners_.size() && listeners_[index].first.get() != lfd) ++index;
        shed_connection(lfd, index);
      } else if (errno != EAGAIN) {
        log_warn(std::string("accept failed: ") + std::strerror(errno));
      }
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
      gid_t groups[256];
      socklen_t gl = sizeof groups;
      if (getsockopt(c, SOL_SOCKET, SO_PEERGROUPS, groups, &gl) == 0)
        peer.groups.assign(groups, groups + gl / sizeof(gid_t));
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
      peer.host = host;
      peer.address = std::string(host) + ":" + std::to_string(port);
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    const char* refused = nullptr;
    bool tls = !is_unix && tls_;
    if (sessions_.size() >= limits_.max_sessions)
      refused = "too many sessions";
    else if (!is_unix && per_address_[peer.host] >= limits_.max_sessions_per_address)
      refused = "too many sessions from one address";
    if (refused) {
      // Closing at once is the answer: the peer sees the connection end.
      uint64_t now = now_monotonic_us();
      ++shed_since_log_;
      if (now - last_shed_log_us_ > 5'000'000) {
        log_warn(std::string("refusing connections: ") + refused,
                 {{"PEER", peer.address}, {"REFUSED", std::to_string(shed_since_log_)}});
        last_shed_log_us_ = now;
        shed_since_log_ = 0;
      }
      continue;
    }
    SSL* ssl = nullptr;
    if (tls) {
      auto r = tls_->new_ssl(fd.get(), "");
      if (!r.ok()) {
        log_warn("refusing a connection: " + r.error().str(), {{"PEER", peer.address}});
        continue;
      }
      ssl = *r;
    }
    auto s = std::make_unique<Session>(loop_, std::move(fd), peer, dispatcher_, max_line_, budget_);
    Session* raw = s.get();
    if (gate_) raw->set_output_gate(gate_);
    if (ssl) {
      // No state for the peer beyond the handshake until it is authenticated.
      raw->use_tls(ssl, limits_.handshake_timeout_us);
      ++handshaking_;
      auto counted = std::make_shared<bool>(true);
      raw->set_on_established([this, counted] {
        if (std::exchange(*counted, false)) handshake_done();
      });
      raw->watch_close([this, counted] {
        if (std::exchange(*counted, false)) handshake_done();
      });
    }
    raw->set_on_close([this] {
      // Free closed sessions outside of their own callbacks.
      if (!reaper_.active()) {
        auto d = loop_.add_defer([this] { reap(); });
        if (d.ok()) reaper_ = std::move(d).value();
      }
    });
    if (!raw->start().ok()) continue;
    if (!is_unix) ++per_address_[peer.host];
    sessions_[raw] = std::move(s);
    if (on_session) on_session(*raw);
  }
}

void Server::shed_connection(int lfd, size_t listener_index) {
  uint64_t now = now_monotonic_us();
  ++shed_since_log_;
  if (now - last_shed_log_us_ > 5'000'000) {
    log_warn("out of file descriptors: refusing connections (raise LimitNOFILE)",
             {{"REFUSED", std::to_string(shed_since_log_)}});
    last_shed_log_us_ = now;
    shed_since_log_ = 0;
  }
  if (spare_fd_.valid()) {
    // Free one descriptor, take the waiting connection and close it, then hold the
    // spare again: the queue drains instead of waking the loop forever.
    spare_fd_.reset();
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) ::close(c);
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (spare_fd_.valid()) return;
  }
  // No spare either: stop watching the listener for a moment.
  if (listener_index >= listeners_.size() || resume_timer_.active()) return;
  (void)listeners_[listener_index].second.set_io_events(0);
  auto t = loop_.add_timer_in(200'000, [this, listener_index] {
    resume_timer_.reset();
    if (!spare_fd_.valid()) spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    bool tcp = std::find(tcp_listeners_.begin(), tcp_listeners_.end(), listener_index) !=
               tcp_listeners_.end();
    if (listener_index < listeners_.size() && (accepting_tcp_ || !tcp))
      (void)listeners_[listener_index].second.set_io_events(EPOLLIN);
  });
  if (t.ok()) resume_timer_ = std::move(t).value();
}

void Server::reap() {
  reaper_.reset();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->first->closed()) {
      const Peer& p = it->first->peer();
      if (!p.is_unix) {
        auto pa = per_address_.find(p.host);
        if (pa != per_address_.end() && --pa->second == 0) per_address_.erase(pa);
      }
      it = sessions_.erase(it);
    } else
      ++it;
  }
}

}  // namespace weft::rpc
