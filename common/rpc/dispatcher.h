// The methods a daemon answers: the call's context, the handler types, the table every
// session of a server shares (Dispatcher), and a daemon's methods as one table of member
// functions with their access level (Method, add_methods).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "common/rpc/peer.h"
#include "common/rpc/protocol.h"

namespace weft::rpc {

class Session;

struct CallContext {
  Session* session;  // null when the call arrived on a blocking Client
  const Peer& peer;
};

using Handler = std::function<Result<json>(const json& params, const CallContext& ctx)>;
// A handler that reads its params as the JSON text they came as (an object's), straight
// into structs of its own without a document: the hot path's messages (machine.report).
using RawHandler = std::function<Result<json>(std::string_view params, const CallContext& ctx)>;
using ReplyFn = std::function<void(Result<json> result)>;

// Method table shared by the sessions of one server (or one client).
class Dispatcher {
 public:
  void add(const std::string& method, Handler h) { handlers_[method] = std::move(h); }
  // A method whose params are read as text: a request on its own line reaches `h` without
  // a document being made of it; in a batch (or while overridden) it is made one and
  // its params serialised again for `h`, so that `h` is its one reader.
  void add_raw(const std::string& method, RawHandler h) {
    auto shared = std::make_shared<RawHandler>(std::move(h));
    raw_[method] = shared;
    handlers_[method] = [shared](const json& p, const CallContext& c) -> Result<json> {
      return (*shared)(p.dump(-1, ' ', false, json::error_handler_t::replace), c);
    };
  }
  bool has_raw() const { return !raw_.empty() && !override_; }
  const RawHandler* find_raw(std::string_view method) const {
    if (override_) return nullptr;
    auto it = raw_.find(method);
    return it == raw_.end() ? nullptr : it->second.get();
  }
  // While set, every call (whatever its method, but `except`) goes to `h`: a control
  // plane replica that does not lead refuses them all. Unset with an empty function.
  void set_override(Handler h, std::string except = {}) {
    override_ = std::move(h);
    except_ = std::move(except);
  }
  const Handler* find(const std::string& method) const {
    if (override_ && method != except_) return &override_;
    auto it = handlers_.find(method);
    return it == handlers_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, Handler> handlers_;
  std::map<std::string, std::shared_ptr<RawHandler>, std::less<>> raw_;
  Handler override_;
  std::string except_;
};

// A daemon's methods as one table of member functions (named handlers apart from the
// logic, like systemd's bus vtables). A method with a nonzero `access` runs only after
// `guard(ctx)` accepted the caller (kPrivileged for the machine daemons; the control
// plane reads the levels itself: Access in controlplane/api/access.h).
template <class T>
struct Method {
  const char* name;
  Result<json> (T::*handler)(const json& params, const CallContext& ctx);
  int access = 0;
};
// The machine daemons' one level: root, the daemon's user or the weft group.
inline constexpr int kPrivileged = 1;
using Guard = std::function<Status(const CallContext&)>;
template <class T, size_t N>
void add_methods(Dispatcher& d, T* self, const Method<T> (&table)[N], Guard guard = {}) {
  for (const Method<T>& m : table)
    d.add(m.name, [self, m, guard](const json& p, const CallContext& c) -> Result<json> {
      if (m.access != 0) TRY(guard(c));
      return (self->*m.handler)(p, c);
    });
}

}  // namespace weft::rpc
