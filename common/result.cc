#include "common/result.h"

#include <cstring>

namespace weft {

std::string Error::str() const {
  std::string out;
  for (auto it = context.rbegin(); it != context.rend(); ++it) {
    out += *it;
    out += ": ";
  }
  if (!field.empty()) {
    out += field;
    out += ": ";
  }
  out += message;
  if (errnum != 0) {
    out += ": ";
    out += std::strerror(errnum);
  }
  return out;
}

Error make_error(std::string message) {
  return Error{0, std::move(message), 0, {}, {}};
}
Error errno_error(int errnum, std::string message) {
  return Error{errnum, std::move(message), 0, {}, {}};
}
Error field_error(std::string field, std::string message) {
  return Error{0, std::move(message), 0, std::move(field), {}};
}

}  // namespace weft
