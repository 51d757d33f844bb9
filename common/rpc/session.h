// One connected peer of the line protocol on an event loop (Session) and the input budget
// the sessions of a server share. Who the peer is: peer.h; the methods it answers:
// dispatcher.h; the gate group commits hold its output behind: output_gate.h.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/fs.h"
#include "common/result.h"
#include "common/rpc/dispatcher.h"
#include "common/rpc/line_reader.h"
#include "common/rpc/output_gate.h"
#include "common/rpc/peer.h"
#include "common/rpc/protocol.h"
#include "common/tls.h"

namespace weft::rpc {

// What all sessions of one Server (or one daemon) may hold in unfinished input lines.
// A session whose partial line would take the total past the cap is closed.
struct BufferBudget {
  size_t limit = 64u << 20;
  size_t used = 0;
};

// One connected peer on an EventLoop. Owns the socket. Requests the peer sends are
// answered through the Dispatcher; requests this side sends get their reply through a
// callback. When the peer goes away, on_close runs once (pending calls fail first).
class Session {
 public:
  Session(EventLoop& loop, Fd fd, Peer peer, const Dispatcher* dispatcher,
          size_t max_line = kDefaultMaxLine, std::shared_ptr<BufferBudget> budget = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // TLS on this session (before start()): it owns `ssl`. Nothing is read or written
  // in the clear; lines queued before the handshake completes go after it. A handshake
  // not finished within `handshake_timeout_us` closes the session.
  void use_tls(SSL* ssl, uint64_t handshake_timeout_us = 10'000'000);
  bool established() const { return !tls_.ssl || tls_.established; }
  // Runs once when the TLS handshake has completed (the peer's identity is known).
  void set_on_established(std::function<void()> fn) { tls_.on_established = std::move(fn); }
  // Output waits while `gate` is held (before start()).
  void set_output_gate(std::shared_ptr<OutputGate> gate) { gated_.gate = std::move(gate); }
  Status start();
  void call(const std::string& method, json params, ReplyFn on_reply);
  // The same call with params already serialised (a JSON text): one message sent to many
  // sessions is serialised once.
  void call_serialized(const std::string& method, const std::string& params, ReplyFn on_reply);
  void notify(const std::string& method, json params);
  // The same notification with params already serialised (one message to many sessions).
  void notify_serialized(const std::string& method, const std::string& params);
  void close();
  // Closes the session once what it has to say (the reply being made included) is sent:
  // a peer told to go elsewhere hears why first.
  void close_when_sent() { close_when_sent_ = true; }
  bool closed() const { return closed_; }
  const Peer& peer() const { return peer_; }
  void set_on_close(std::function<void()> fn) { on_close_ = std::move(fn); }
  // Further code that must know when the session closes (the owner's on_close stays).
  void watch_close(std::function<void()> fn) { close_watchers_.push_back(std::move(fn)); }
  // Bytes of lines given to this session to send (gated or not), and bytes of them that
  // have left it for the socket (or the TLS engine): output queued at bytes_queued() == q
  // has left once bytes_sent() >= q. A relay bounds what it holds for a peer by them.
  uint64_t bytes_queued() const { return bytes_queued_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  // When the peer last sent a whole message (CLOCK_MONOTONIC, microseconds; the start
  // until then): a peer that stopped answering is told from a slow one by how long ago.
  uint64_t last_heard_us() const { return last_heard_us_; }
  // From inside a handler: the reply to the request being handled is sent later,
  // through the function returned (once; the handler's own result is ignored). The
  // function may outlive the session: a reply to a closed session is dropped. A
  // request of a batch answered this way is answered on its own line.
  ReplyFn defer_reply();
  // From inside a handler: whether the message being handled is a request (answered),
  // not a notification.
  bool answering() const { return handling_id_ != nullptr; }

 private:
  void on_io(uint32_t revents);
  // TLS: drives the handshake; false when the session is not (yet) established.
  bool handshake();
  void read_plain();
  void read_tls();
  void feed(const char* data, size_t n);
  void update_events();
  void handle_line(const std::string& line);
  // One request, notification or response; the reply to send, if any.
  std::optional<json> handle_message(const json& msg);
  // A request for a raw handler (Dispatcher::add_raw), answered without a document; false
  // when the line is not one (a batch, another method, an envelope it does not take as
  // is): the usual path then reads it, and gives the errors.
  bool handle_raw(const std::string& line);
  void handle_response(const json& msg);
  void account_buffered();
  void send_json(const json& msg);
  void flush();
  void send_line(std::string line);  // a whole line (with its '\n'), through the gate
  void reply_error(const json& id, const RpcError& e);

  EventLoop& loop_;
  Fd fd_;
  Peer peer_;
  const Dispatcher* dispatcher_;
  LineReader reader_;
  Source io_;
  std::string out_;
  bool closed_ = false;
  bool close_when_sent_ = false;
  bool want_out_ = false;
  uint64_t bytes_queued_ = 0, bytes_sent_ = 0;
  int64_t next_id_ = 1;
  uint64_t last_heard_us_ = 0;
  // defer_reply(): the id of the request being handled, and whether it was deferred.
  const json* handling_id_ = nullptr;
  bool deferred_ = false;
  std::shared_ptr<Session*> self_ = std::make_shared<Session*>(this);  // null once gone
  std::map<int64_t, ReplyFn> pending_;
  std::shared_ptr<BufferBudget> budget_;
  size_t accounted_ = 0;  // this session's share of budget_->used
  std::function<void()> on_close_;
  std::vector<std::function<void()>> close_watchers_;
  // TLS state.
  struct SslFree {
    void operator()(SSL* s) const { tls::free_ssl(s); }
  };
  struct TlsState {
    std::unique_ptr<SSL, SslFree> ssl;
    bool established = false;
    bool wants_write = false;  // the TLS engine needs the socket writable
    uint64_t handshake_timeout_us = 0;
    Source handshake_timer;
    std::function<void()> on_established;
  } tls_;
  // The output gate (group commits: common/rpc/output_gate.h) and the output it holds,
  // by epoch, oldest first (out_ holds only what may be sent).
  struct GatedOutput {
    std::shared_ptr<OutputGate> gate;
    bool waiting = false;  // listed in gate->waiting_
    std::deque<std::pair<uint64_t, std::string>> lines;
    size_t bytes = 0;
  } gated_;
  // Moves the gated output of epochs up to `e` to out_ and sends it.
  void ungate(uint64_t e);
  friend class OutputGate;
};

}  // namespace weft::rpc
