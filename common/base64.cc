#include "common/base64.h"

#include <openssl/evp.h>

#include <climits>

namespace weft {

std::string base64_encode(std::string_view in) {
  if (in.size() > static_cast<size_t>(INT_MAX / 4 * 3)) return {};  // not for gigabytes
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0 || in.size() > static_cast<size_t>(INT_MAX))
    return make_error("bad base64: its length is not a multiple of 4");
  std::string out(3 * (in.size() / 4) + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return make_error("bad base64: a character outside its alphabet");
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding's zero bytes.
  for (size_t i = in.size(); i > 0 && in[i - 1] == '=' && len > 0; --i) --len;
  out.resize(len);
  return out;
}

}  // namespace weft
