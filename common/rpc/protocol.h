// The weft line protocol (docs/protocol.md): JSON-RPC 2.0, one JSON object per
// '\n'-terminated line, over Unix stream sockets and TCP; either side of a session may
// send requests. Its error codes and the mapping between weft's Error and the wire's.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"

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
  // A region's machine that belongs elsewhere (docs/regions.md): data {"endpoints":
  // "a,b"} names the control plane that holds it now ("": the region's brokers).
  kMoved = -32009,
};

inline constexpr size_t kDefaultMaxLine = 1 << 20;  // 1 MiB
// Requests in one JSON-RPC batch (an array of request objects).
inline constexpr size_t kMaxBatch = 1000;

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

}  // namespace weft::rpc
