// Clients of the line protocol: the event loop's non-blocking connect (ConnectAttempt)
// and the blocking Client of CLIs and tests, with TLS as a stream it can load.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/fs.h"
#include "common/result.h"
#include "common/rpc/endpoint.h"
#include "common/rpc/session.h"
#include "common/tls.h"

namespace weft::rpc {

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
// (common/rpc/client_tls.cc). Made by ClientTls::open over a connected socket.
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
// TLS with `context` (its certificate, key and CA): common/rpc/client_tls.cc, which links OpenSSL.
ClientTls client_tls(std::shared_ptr<tls::Context> context, std::string server_name = {});

// A blocking client for CLIs and tests: one call at a time. Requests the server sends
// meanwhile are answered by `dispatcher` (method-not-found when null); its notifications
// are handed to `dispatcher` too (and dropped without one). An endpoint
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
  // A notification (no answer comes).
  Status notify(const std::string& method, json params);
  void set_dispatcher(const Dispatcher* d) { dispatcher_ = d; }
  // Handles what the server sent that is here now (its requests and notifications, to
  // the dispatcher), without waiting: a caller that polls fd() for a stream of
  // notifications (`weftctl task exec`). An error once the session is closed.
  Status pump();
  int fd() const { return fd_.get(); }
  // The server's certificate (TLS sessions).
  const tls::Identity& server_identity() const { return server_peer_.identity; }
  // Whether the TLS session was resumed from a ticket (no certificate exchange).
  bool resumed() const { return resumed_; }

 private:
  explicit Client(Fd fd, size_t max_line) : fd_(std::move(fd)), reader_(max_line) {}
  Status handshake(const std::string& server, int timeout_ms);
  Status send_line(const std::string& line);
  Status serve(const json& msg);  // a request or notification from the server
  // The next whole message buffered, a JSON object (a line that is not one is skipped);
  // nothing when no whole line is buffered; `overflow` when a line is over the limit.
  Result<std::optional<json>> next_message(const char* overflow);
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
