// Internal to the protocol's implementation (common/rpc/*.cc): shared by the
// blocking client and the event-loop sessions. Not for other code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/result.h"
#include "common/rpc/endpoint.h"
#include "common/rpc/protocol.h"

namespace weft::rpc {

// Reads the "error" member of a reply without trusting its shape.
RpcError error_from_json(const json& e);

namespace detail {

Result<std::vector<char>> unix_address(const std::string& path);
// A numeric address needs no resolver.
std::optional<std::vector<char>> numeric_address(const std::string& host, uint16_t port);
Result<std::vector<std::vector<char>>> resolve_blocking(const std::string& host, uint16_t port);
// Starts a non-blocking connect; the fd is connected or connecting (EINPROGRESS).
Result<Fd> start_connect(const std::vector<char>& addr, bool* in_progress);
std::string endpoint_name(const Endpoint& ep);

}  // namespace detail
}  // namespace weft::rpc
