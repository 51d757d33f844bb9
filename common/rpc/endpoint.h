#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace weft::rpc {

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

}  // namespace weft::rpc
