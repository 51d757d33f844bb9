// The weft line protocol: JSON-RPC 2.0, one JSON object per '\n'-terminated line,
// over Unix stream sockets and TCP. Either side of a session may send requests.
// See docs/protocol.md for the wire format and error codes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/fs.h"
#include "common/paths.h"
#include "common/result.h"
#include "common/tls.h"

namespace weft::rpc {

using json = nlohmann::json;

enum RpcCode : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
  // Application errors (JSON-RPC reserves -32000..-32099 for servers).
  kNotFound = -32001,
  kPermissionDenied = -32002,
  kConflict = -32003,
  kUnsupported = -32004,
  kLineTooLong = -32005,
  kUnavailable = -32006,
  kTimeout = -32007,
  // A control plane replica that does not lead (docs/replicas.md); data {"leader":
  // "host:port"} names the one that does, when known.
  kNotLeader = -32008,
};

inline constexpr size_t kDefaultMaxLine = 1 << 20;  // 1 MiB
// Requests in one JSON-RPC batch (an array of request objects).
inline constexpr size_t kMaxBatch = 1000;

// What all sessions of one Server (or one daemon) may hold in unfinished input lines.
// A session whose partial line would take the total past the cap is closed.
struct BufferBudget {
  size_t limit = 64u << 20;
  size_t used = 0;
};

struct RpcError {
  int code = kInternalError;
  std::string message;
  json data;  // null when absent; {"field": "..."} for bad params
};

// Maps a weft Error to a protocol error: its own code if set, else invalid params when
// it names a field, else `fallback`.
RpcError to_rpc_error(const Error& e, int fallback = kInternalError);
// And back, for clients: the message, code and field survive.
Error from_rpc_error(const RpcError& e);
json error_object(const RpcError& e);

// Splits a byte stream into lines, enforcing a maximum length. A line longer than the
// limit is reported once as overflow and skipped up to its newline; the stream stays
// usable.
class LineReader {
 public:
  explicit LineReader(size_t max_line = kDefaultMaxLine) : max_(max_line) {}
  void feed(const char* data, size_t n);
  enum class Kind { kNone, kLine, kOverflow };
  // Next complete line (without '\n'), or kOverflow for a skipped long line.
  Kind next(std::string* line);
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  size_t max_;
  bool skipping_ = false;
  bool overflow_pending_ = false;
};

struct Peer {
  bool is_unix = false;
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  // Supplementary groups of the peer when it connected (SO_PEERGROUPS): taken from the
  // socket, not from /proc/<pid>, so a pid reused after the peer exited cannot lend
  // its groups.
  std::vector<gid_t> groups;
  std::string address;  // "unix" or "ip:port"
  std::string host;     // TCP: the source address without the port
  // TLS sessions: the peer's certificate verified against the CA bundle (and CRL), and
  // who it says the peer is. Set once the handshake is done.
  bool tls = false;
  tls::Identity identity;
};

class Session;

// Group commit (the control plane): while a gate is held, the sessions that share it
// keep what they would send (replies, requests) until release(): a daemon writes many
// calls' changes in one transaction and answers none of them before it is durable.
class OutputGate {
 public:
  void hold() { held_ = true; }
  bool held() const { return held_; }
  // Sends what waited, session by session.
  void release();

 private:
  friend class Session;
  bool held_ = false;
  std::vector<Session*> waiting_;
};

struct CallContext {
  Session* session;  // null when the call arrived on a blocking Client
  const Peer& peer;
};

using Handler = std::function<Result<json>(const json& params, const CallContext& ctx)>;
using ReplyFn = std::function<void(Result<json> result)>;

// Method table shared by the sessions of one server (or one client).
class Dispatcher {
 public:
  void add(const std::string& method, Handler h) { handlers_[method] = std::move(h); }
  // While set, every call (whatever its method, but `except`) goes to `h`: a control
  // plane replica that does not lead refuses them all. Unset with an empty function.
  void set_override(Handler h, std::string except = {}) {
    override_ = std::move(h);
    except_ = std::move(except);
  }
  const Handler* find(const std::string& method) const {
    if (override_ && method != except_) return &override_;
    auto it = handlers_.find(method);
    return it == handlers_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, Handler> handlers_;
  Handler override_;
  std::string except_;
};

// A daemon's methods as one table of member functions (named handlers apart from the
// logic, like systemd's bus vtables). A method with a nonzero `access` runs only after
// `guard(ctx)` accepted the caller (kPrivileged for the machine daemons; the control
// plane reads the levels itself: Access in controlplane/manager.h).
template <class T>
struct Method {
  const char* name;
  Result<json> (T::*handler)(const json& params, const CallContext& ctx);
  int access = 0;
};
// The machine daemons' one level: root, the daemon's user or the weft group.
inline constexpr int kPrivileged = 1;
using Guard = std::function<Status(const CallContext&)>;
template <class T, size_t N>
void add_methods(Dispatcher& d, T* self, const Method<T> (&table)[N], Guard guard = {}) {
  for (const Method<T>& m : table)
    d.add(m.name, [self, m, guard](const json& p, const CallContext& c) -> Result<json> {
      if (m.access != 0) TRY(guard(c));
      return (self->*m.handler)(p, c);
    });
}

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
  bool established() const { return !ssl_ || established_; }
  // Runs once when the TLS handshake has completed (the peer's identity is known).
  void set_on_established(std::function<void()> fn) { on_established_ = std::move(fn); }
  // Output waits while `gate` is held (before start()).
  void set_output_gate(std::shared_ptr<OutputGate> gate) { gate_ = std::move(gate); }
  Status start();
  void call(const std::string& method, json params, ReplyFn on_reply);
  void notify(const std::string& method, json params);
  void close();
  bool closed() const { return closed_; }
  const Peer& peer() const { return peer_; }
  void set_on_close(std::function<void()> fn) { on_close_ = std::move(fn); }
  // Further code that must know when the session closes (the owner's on_close stays).
  void watch_close(std::function<void()> fn) { close_watchers_.push_back(std::move(fn)); }
  // When the peer last sent a whole message (CLOCK_MONOTONIC, microseconds; the start
  // until then): a peer that stopped answering is told from a slow one by how long ago.
  uint64_t last_heard_us() const { return last_heard_us_; }
  // From inside a handler: the reply to the request being handled is sent later,
  // through the function returned (once; the handler's own result is ignored). The
  // function may outlive the session: a reply to a closed session is dropped. A
  // request of a batch answered this way is answered on its own line.
  ReplyFn defer_reply();

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
  void handle_response(const json& msg);
  void account_buffered();
  void send_json(const json& msg);
  void flush();
  void reply_error(const json& id, const RpcError& e);

  EventLoop& loop_;
  Fd fd_;
  Peer peer_;
  const Dispatcher* dispatcher_;
  LineReader reader_;
  Source io_;
  std::string out_;
  bool closed_ = false;
  bool want_out_ = false;
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
  std::unique_ptr<SSL, SslFree> ssl_;
  bool established_ = false;
  bool tls_wants_write_ = false;  // the TLS engine needs the socket writable
  uint64_t handshake_timeout_us_ = 0;
  Source handshake_timer_;
  std::function<void()> on_established_;
  std::shared_ptr<OutputGate> gate_;
  bool gate_waiting_ = false;  // listed in gate_->waiting_
  friend class OutputGate;
};

// Endpoints: "unix:/path", "/path" (Unix), "tcp:host:port" or "host:port" (TCP).
struct Endpoint {
  bool is_unix = true;
  std::string path;  // unix
  std::string host;  // tcp
  uint16_t port = 0;
};
Result<Endpoint> parse_endpoint(const std::string& s);
// "a:7070, b:7070" -> {"a:7070", "b:7070"} (blanks around commas dropped): a list of
// replicas' endpoints.
std::vector<std::string> split_endpoints(const std::string& list);

// Accepts sessions on Unix and TCP listeners. Owns its sessions and frees each one after
// it closes.
struct ServerLimits {
  // Sessions at once; 0 = the descriptor limit (RLIMIT_NOFILE) less a reserve of 64.
  size_t max_sessions = 0;
  // TCP sessions from one source address at once.
  size_t max_sessions_per_address = 256;
  // Bytes of unfinished input lines held across all sessions.
  size_t max_buffered_bytes = 64u << 20;
  // TLS: connections whose handshake is not finished, at once (more wait unaccepted in
  // the listen queue), and how long one may take.
  size_t max_handshaking = 256;
  uint64_t handshake_timeout_us = 10'000'000;
};

class Server {
 public:
  Server(EventLoop& loop, const Dispatcher* dispatcher, size_t max_line = kDefaultMaxLine,
         ServerLimits limits = {});
  ~Server();
  // Binds a Unix socket (replacing a stale one), chmods it to `mode` and, when
  // group_gid >= 0, chowns it to that group.
  Status listen_unix(const std::string& path, mode_t mode, int group_gid = -1);
  // Binds TCP; port 0 picks a free port (see tcp_port()).
  Status listen_tcp(const std::string& host, uint16_t port);
  // TLS on every TCP session from now on (Unix sessions keep their peer credentials).
  void set_tls(std::shared_ptr<tls::Context> ctx) { tls_ = std::move(ctx); }
  // Every session from now on shares this output gate (OutputGate).
  void set_output_gate(std::shared_ptr<OutputGate> gate) { gate_ = std::move(gate); }
  uint16_t tcp_port() const { return tcp_port_; }
  size_t session_count() const { return sessions_.size(); }
  std::function<void(Session&)> on_session;  // optional: runs for each new session

 private:
  void accept_on(int lfd, bool is_unix);
  // Out of descriptors: refuse the connection at the head of the queue with the spare
  // descriptor, or pause the listener briefly when even that is gone.
  void shed_connection(int lfd, size_t listener_index);
  // Pauses or resumes accepting on the TCP listeners (the handshake cap).
  void set_tcp_accepting(bool on);
  void handshake_done();
  void reap();
  EventLoop& loop_;
  const Dispatcher* dispatcher_;
  size_t max_line_;
  ServerLimits limits_;
  std::shared_ptr<OutputGate> gate_;
  std::shared_ptr<BufferBudget> budget_;
  Fd spare_fd_;
  std::map<std::string, size_t> per_address_;
  Source resume_timer_;
  uint64_t last_shed_log_us_ = 0;
  uint64_t shed_since_log_ = 0;
  std::vector<std::pair<Fd, Source>> listeners_;
  std::vector<size_t> tcp_listeners_;  // indices into listeners_
  bool accepting_tcp_ = true;
  std::vector<std::string> unix_paths_;
  std::map<Session*, std::unique_ptr<Session>> sessions_;
  Source reaper_;
  uint16_t tcp_port_ = 0;
  std::shared_ptr<tls::Context> tls_;
  size_t handshaking_ = 0;
};

// The local-socket access rule of every weft daemon: a Unix peer that is root, the
// daemon's own user, or a member (primary or supplementary, from the socket's
// SO_PEERGROUPS) of `gid`. Errors carry kPermissionDenied and say what `action` needed.
Status require_privileged(const Peer& peer, int gid, const std::string& group_name,
                          const std::string& action);

// Connects a stream socket to an endpoint (blocking connect, then O_NONBLOCK|CLOEXEC).
// For CLIs and tests only: daemons use ConnectAttempt, which never blocks their loop.
Result<Fd> connect_endpoint(const Endpoint& ep, int timeout_ms = 10000);

// A non-blocking connect on an EventLoop: the name is resolved on a helper thread when
// it is not a numeric address, each address is tried with a non-blocking connect, and
// the whole attempt ends by `timeout_us`. `done` runs once, on the loop, unless the
// attempt is destroyed first (which cancels it; a resolver thread still running
// finishes on its own and its answer is dropped).
class ConnectAttempt {
 public:
  using Done = std::function<void(Result<Fd>)>;
  static std::unique_ptr<ConnectAttempt> start(EventLoop& loop, const Endpoint& ep,
                                               uint64_t timeout_us, Done done);
  ~ConnectAttempt();
  ConnectAttempt(const ConnectAttempt&) = delete;
  ConnectAttempt& operator=(const ConnectAttempt&) = delete;

  struct Resolve;  // shared with the resolver thread

 private:
  ConnectAttempt(EventLoop& loop, Endpoint ep, Done done)
      : loop_(loop), ep_(std::move(ep)), done_(std::move(done)) {}
  void begin(uint64_t timeout_us);
  void resolved();
  void try_next();
  void on_writable();
  void finish(Result<Fd> r);

  EventLoop& loop_;
  Endpoint ep_;
  Done done_;
  std::shared_ptr<Resolve> resolve_;
  std::vector<std::vector<char>> addrs_;  // sockaddr bytes, in resolver order
  size_t next_ = 0;
  Fd fd_;
  Error last_ = make_error("no address");
  Source io_, timer_, resolve_io_, defer_;
};

// What a blocking Client reads and writes through when it is not the bare socket: TLS
// (rpc_client_tls.cc). Made by ClientTls::open over a connected socket.
class ClientStream {
 public:
  virtual ~ClientStream() = default;
  virtual tls::Want handshake(std::string* why) = 0;
  virtual tls::Want read(char* buf, size_t n, size_t* got, std::string* why) = 0;
  virtual tls::Want write(const char* buf, size_t n, size_t* put, std::string* why) = 0;
  virtual tls::Identity peer_identity() = 0;
  virtual bool resumed() = 0;
};

// TLS for a blocking client. `open` makes the stream over a connected socket for a
// server whose certificate must carry `server_name`. A function, not the OpenSSL
// context itself, so that rpc::Client links no OpenSSL: weftctl loads it only for a
// tls:// endpoint (cli/tls_module.cc).
struct ClientTls {
  std::function<Result<std::unique_ptr<ClientStream>>(int fd, const std::string& server_name)> open;
  std::string server_name;  // default: the endpoint's host
};
// TLS with `context` (its certificate, key and CA): rpc_client_tls.cc, which links OpenSSL.
ClientTls client_tls(std::shared_ptr<tls::Context> context, std::string server_name = {});

// A blocking client for CLIs and tests: one call at a time. Requests the server sends
// meanwhile are answered by `dispatcher` (method-not-found when null). An endpoint
// "tls://host:port" (or any TCP endpoint when `tls` is given) is a mutual-TLS session;
// the handshake completes (or fails, saying why) in connect().
class Client {
 public:
  static Result<std::unique_ptr<Client>> connect(const std::string& endpoint,
                                                 size_t max_line = kDefaultMaxLine,
                                                 const ClientTls* tls = nullptr,
                                                 int timeout_ms = 10000);
  ~Client();
  Result<json> call(const std::string& method, json params, int timeout_ms = 30000);
  void set_dispatcher(const Dispatcher* d) { dispatcher_ = d; }
  int fd() const { return fd_.get(); }
  // The server's certificate (TLS sessions).
  const tls::Identity& server_identity() const { return server_peer_.identity; }
  // Whether the TLS session was resumed from a ticket (no certificate exchange).
  bool resumed() const { return resumed_; }

 private:
  explicit Client(Fd fd, size_t max_line) : fd_(std::move(fd)), reader_(max_line) {}
  Status handshake(const std::string& server, int timeout_ms);
  Status send_line(const std::string& line);
  // Bytes available now (0: none yet, wait for the socket); an error when closed.
  Result<size_t> read_some(char* buf, size_t n);
  Fd fd_;
  std::unique_ptr<ClientStream> stream_;  // TLS; after fd_, so destroyed before it closes
  bool resumed_ = false;
  LineReader reader_;
  int64_t next_id_ = 1;
  const Dispatcher* dispatcher_ = nullptr;
  Peer server_peer_;
};

}  // namespace weft::rpc
