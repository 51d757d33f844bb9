#include "common/base64.h"

#include <resolv.h>

#include <climits>

namespace weft {

std::string base64_encode(std::string_view in) {
  if (in.size() > static_cast<size_t>(INT_MAX / 4 * 3)) return {};  // not for gigabytes
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = b64_ntop(reinterpret_cast<const unsigned char*>(in.data()), in.size(), out.data(),
                   out.size());
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0 || in.size() > static_cast<size_t>(INT_MAX))
    return make_error("bad base64: its length is not a multiple of 4");
  // b64_pton skips white space; this reader takes the alphabet alone, with at most two
  // '=' at the very end.
  size_t pad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '+' || c == '/';
    if (c == '=' && i + 2 >= in.size()) {
      ++pad;
    } else if (!alpha || pad != 0) {
      return make_error("bad base64: a character outside its alphabet");
    }
  }
  if (pad == 1 && in.back() != '=')
    return make_error("bad base64: a character outside its alphabet");
  std::string out(3 * (in.size() / 4) + 1, '\0');
  // A NUL-terminated copy: b64_pton reads a C string.
  std::string text(in);
  int n = b64_pton(text.c_str(), reinterpret_cast<unsigned char*>(out.data()), out.size());
  if (n < 0) return make_error("bad base64: its padding is wrong");
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace weft
