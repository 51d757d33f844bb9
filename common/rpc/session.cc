// One connected peer on an event loop (session.h), and the output gate group commits hold
// its replies behind (output_gate.h).
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
#include "common/rpc/detail.h"

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
    s->gated_.waiting = false;
    s->ungate(UINT64_MAX);
  }
}

void OutputGate::release_through(uint64_t e) {
  auto waiting = std::exchange(waiting_, {});
  for (Session* s : waiting) {
    s->gated_.waiting = false;
    s->ungate(e);
    if (!s->gated_.lines.empty() && !std::exchange(s->gated_.waiting, true)) waiting_.push_back(s);
  }
}

void Session::ungate(uint64_t e) {
  while (!gated_.lines.empty() && gated_.lines.front().first <= e) {
    gated_.bytes -= gated_.lines.front().second.size();
    out_ += gated_.lines.front().second;
    gated_.lines.pop_front();
  }
  flush();
}

Session::~Session() {
  *self_ = nullptr;
  if (gated_.waiting) std::erase(gated_.gate->waiting_, this);
  io_.reset();
  if (tls_.ssl && tls_.established && !closed_) tls::shutdown(tls_.ssl.get());
  if (budget_) budget_->used -= accounted_;
  // Fail calls still waiting for a reply, without running on_close again.
  auto pending = std::move(pending_);
  for (auto& [id, fn] : pending) fn(make_error("session closed").with_code(kUnavailable));
}

void Session::use_tls(SSL* ssl, uint64_t handshake_timeout_us) {
  tls_.ssl.reset(ssl);
  tls_.handshake_timeout_us = handshake_timeout_us;
}

Status Session::start() {
  // Edge-triggered: every handler reads until the socket is drained and writes until it
  // is full, so a ready socket is reported once, not by every wait of the loop (with
  // thousands of sessions, level-triggered waits cost O(ready sessions) per dispatch).
  last_heard_us_ = now_monotonic_us();
  TRY_ASSIGN(io_, loop_.add_io(fd_.get(), EPOLLIN | EPOLLET, [this](uint32_t ev) { on_io(ev); }));
  if (tls_.ssl) {
    TRY_ASSIGN(tls_.handshake_timer, loop_.add_timer_in(tls_.handshake_timeout_us, [this] {
      if (tls_.established || closed_) return;
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
  if (tls_.established) return true;
  std::string why;
  switch (tls::handshake(tls_.ssl.get(), &why)) {
    case tls::Want::kDone:
      tls_.established = true;
      tls_.wants_write = false;
      tls_.handshake_timer.reset();
      peer_.tls = true;
      peer_.identity = tls::peer_identity(tls_.ssl.get());
      if (tls_.on_established) {
        auto fn = std::move(tls_.on_established);
        fn();
      }
      if (closed_) return false;
      flush();  // what was queued before
      return !closed_;
    case tls::Want::kRead:
      tls_.wants_write = false;
      return false;
    case tls::Want::kWrite:
      tls_.wants_write = true;
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
  // Output the gate holds is in gated_.lines, not out_: a writable socket is wanted only for
  // what may be sent (else it would wake the loop for nothing, again and again).
  bool want_out = !out_.empty() || tls_.wants_write;
  if (tls_.ssl && !tls_.established) want_out = tls_.wants_write;
  if (want_out != want_out_) {
    want_out_ = want_out;
    (void)io_.set_io_events(want_out ? (EPOLLIN | EPOLLOUT | EPOLLET) : (EPOLLIN | EPOLLET));
  }
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  io_.reset();
  tls_.handshake_timer.reset();
  if (budget_) {
    budget_->used -= accounted_;
    accounted_ = 0;
  }
  if (tls_.ssl && tls_.established) tls::shutdown(tls_.ssl.get());
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
  if (tls_.ssl && !tls_.established) {
    if (!handshake()) {
      update_events();
      return;
    }
  }
  if (revents & EPOLLOUT) flush();
  if (closed_) return;
  if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    if (tls_.ssl)
      read_tls();
    else
      read_plain();
  }
  if (closed_) return;
  if (tls_.ssl && !out_.empty()) flush();  // a write that waited for the peer's data
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
    switch (tls::read(tls_.ssl.get(), buf, sizeof buf, &got, &why)) {
      case tls::Want::kDone:
        feed(buf, got);
        if (closed_) return;
        continue;  // the record layer may hold more than one read's worth
      case tls::Want::kRead:
        return;
      case tls::Want::kWrite:
        tls_.wants_write = true;
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
  if (gated_.gate && gated_.gate->held()) {  // not yet durable: sent when its epoch is released
    uint64_t e = gated_.gate->epoch();
    if (gated_.lines.empty() || gated_.lines.back().first != e)
      gated_.lines.emplace_back(e, std::string());
    gated_.lines.back().second += line;
    gated_.bytes += line.size();
    if (!std::exchange(gated_.waiting, true)) gated_.gate->waiting_.push_back(this);
    if (gated_.bytes + out_.size() > (64u << 20)) {
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
  if (tls_.ssl && !tls_.established) return;  // queued until the handshake completes
  tls_.wants_write = false;
  while (!out_.empty()) {
    if (tls_.ssl) {
      size_t put = 0;
      std::string why;
      tls::Want w = tls::write(tls_.ssl.get(), out_.data(), out_.size(), &put, &why);
      if (w == tls::Want::kDone) {
        bytes_sent_ += put;
        out_.erase(0, put);
        continue;
      }
      if (w == tls::Want::kWrite) {
        tls_.wants_write = true;
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
  if (close_when_sent_ && out_.empty() && gated_.lines.empty()) {
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

}  // namespace weft::rpc
