// Base64 (RFC 4648, with padding) through OpenSSL: etcd's JSON gateway carries keys and
// values in it, and registries' Basic authentication sends "user:password" in it.
#pragma once

#include <string>
#include <string_view>

#include "common/result.h"

namespace weft {

std::string base64_encode(std::string_view in);
// Hostile input: a length that is not a multiple of 4 or a character outside the
// alphabet is an error, never a crash.
Result<std::string> base64_decode(std::string_view in);

}  // namespace weft
