// HTTP requests from a daemon's event loop with libcurl's multi-socket interface: curl
// says which sockets to watch and when its timer is due; the loop tells it what became
// ready. Nothing blocks: connect, send and receive run as the sockets allow, every
// request bounded by its own timeout.
//
// The caller may hand curl the socket to use (`open_socket`): weft-agent's readiness
// checks create it in a task's network namespace.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/result.h"

namespace weft {

struct HttpRequest {
  std::string url;
  uint64_t timeout_us = 1'000'000;
  // Creates the socket for the connection (family, type, protocol as socket(2)); -1 with
  // errno set on failure. Empty: curl's own socket(2).
  std::function<int(int family, int type, int protocol)> open_socket;
  size_t max_body = 4096;  // what is kept of the body (the rest is read and dropped)
};

struct HttpResponse {
  long status = 0;
  std::string body;
};

class HttpClient {
 public:
  using Done = std::function<void(Result<HttpResponse>)>;
  static Result<std::unique_ptr<HttpClient>> create(EventLoop& loop);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Starts a GET; `done` runs on the loop once it ends (never from inside get()). Returns
  // a handle for cancel().
  Result<uint64_t> get(HttpRequest req, Done done);
  // Drops a request: its callback never runs.
  void cancel(uint64_t id);
  size_t in_flight() const;

  struct Impl;

 private:
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft
