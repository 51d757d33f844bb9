// Result<T>: a value or an Error. The one way weft code reports failure.
//
// An Error carries an errno (0 when not from the kernel), a message, an optional
// field path (for bad input: "resources.memory_max", "agent.toml:12") and a chain
// of context added as it travels up ("create cgroup tasks/ab12: ...").
// Either log an error or return it, never both.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace weft {

struct Error {
  int errnum = 0;
  std::string message;
  // Protocol error code when this error travels over the line protocol (see
  // rpc/protocol.h RpcCode); 0 lets the server pick (invalid params when `field` is set).
  int code = 0;
  std::string field;                 // offending input field or file:line, if any
  std::vector<std::string> context;  // outermost last
  // rpc::kNotLeader: where the leading control plane is ("host:port"; empty: unknown).
  // rpc::kMoved: the endpoints of the control plane that holds the machine now (empty:
  // the region's brokers).
  std::string leader;

  // "context2: context1: message: strerror" — the form logs and CLIs print.
  std::string str() const;

  Error with_code(int c) && {
    code = c;
    return std::move(*this);
  }
  Error wrap(std::string ctx) && {
    context.push_back(std::move(ctx));
    return std::move(*this);
  }
};

Error make_error(std::string message);
Error errno_error(int errnum, std::string message);  // errnum as returned by the call
Error field_error(std::string field, std::string message);
// errno_error(errno, ...) for the common case right after a failed syscall.
inline Error sys_error(std::string message) {
  return errno_error(errno, std::move(message));
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }
  T value_or(T fallback) const { return ok() ? value() : std::move(fallback); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), failed_(true) {}  // NOLINT
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const& { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_;
  bool failed_ = false;
};

using Status = Result<void>;

}  // namespace weft

// Early-return helpers. TRY_ASSIGN(var, expr) declares var from a Result.
#define WEFT_CONCAT_(a, b) a##b
#define WEFT_CONCAT(a, b) WEFT_CONCAT_(a, b)
#define TRY(expr)                                                 \
  do {                                                            \
    auto&& weft_try_r_ = (expr);                                  \
    if (!weft_try_r_.ok()) return std::move(weft_try_r_).error(); \
  } while (0)
#define TRY_CTX(expr, ctx)                                                  \
  do {                                                                      \
    auto&& weft_try_r_ = (expr);                                            \
    if (!weft_try_r_.ok()) return std::move(weft_try_r_).error().wrap(ctx); \
  } while (0)
#define TRY_ASSIGN_IMPL_(tmp, var, expr)        \
  auto tmp = (expr);                            \
  if (!tmp.ok()) return std::move(tmp).error(); \
  var = std::move(tmp).value()
#define TRY_ASSIGN(var, expr) TRY_ASSIGN_IMPL_(WEFT_CONCAT(weft_r_, __LINE__), var, expr)
