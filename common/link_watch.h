// Network link events from rtnetlink (libnl): one callback per RTM_NEWLINK/RTM_DELLINK,
// carrying the interface's name, administrative state and carrier, as the kernel sends
// them. Used by weft-sidekick (re-check knobs when a link appears) and weft-hcs
// (carrier loss and flaps as they happen, not at the next poll). When the socket
// overflows under a burst the kernel drops events; the callback then gets one event
// with `overflow` set, meaning "re-read every link".
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/result.h"

struct nl_sock;
struct nl_msg;

namespace weft {

struct LinkEvent {
  std::string ifname;
  int ifindex = 0;
  bool admin_up = false;  // IFF_UP
  bool carrier = false;   // IFF_LOWER_UP
  bool removed = false;   // RTM_DELLINK
  bool overflow = false;  // events were lost; re-read everything
};

class LinkWatch {
 public:
  using Fn = std::function<void(const LinkEvent&)>;
  static Result<std::unique_ptr<LinkWatch>> start(EventLoop& loop, Fn fn);
  ~LinkWatch();

 private:
  LinkWatch() = default;
  void readable();
  static int on_msg(::nl_msg* msg, void* arg);
  struct nl_sock* sock_ = nullptr;
  Source src_;
  Fn fn_;
};

}  // namespace weft
