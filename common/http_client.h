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
#include <string_view>
#include <vector>

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
  // For registries and downloads (a probe leaves these as they are):
  bool head = false;                 // HEAD instead of GET
  std::vector<std::string> headers;  // "Name: value" lines sent with the request
  // A 2xx response's body goes here as it arrives (with the status: 200 or 206 for a
  // Range request) instead of into `body`; returning false aborts the transfer (an
  // error). Other statuses still fill `body`.
  std::function<bool(long status, std::string_view)> on_data;
  // Follows up to five redirects, to http or https only; curl sends no Authorization
  // header to a host other than the first.
  bool follow_redirects = false;
  // With `timeout_us` 0 (no limit on the whole transfer, a large blob): the transfer
  // fails when it moves less than 1 KiB/s for this long.
  uint64_t stall_timeout_us = 0;
  // Receives at most this many bytes a second (0: no limit); curl paces the socket.
  uint64_t max_recv_bytes_per_s = 0;
  std::string ca_file;     // trusted CAs for https (empty: the system's)
  bool use_proxy = false;  // the environment's https_proxy/no_proxy (probes never)
};

struct HttpResponse {
  long status = 0;
  std::string body;
  // The final response's headers (after redirects), names in lowercase; a repeated
  // header keeps its last value.
  std::map<std::string, std::string> headers;
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
