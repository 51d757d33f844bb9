#include "common/link_watch.h"

#include <linux/if.h>
#include <linux/rtnetlink.h>
#include <netlink/attr.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/socket.h>

namespace weft {

namespace {
Error nl_err(int err, const std::string& what) {
  return make_error(what + ": " + nl_geterror(err)).wrap("rtnetlink");
}
}  // namespace

Result<std::unique_ptr<LinkWatch>> LinkWatch::start(EventLoop& loop, Fn fn) {
  std::unique_ptr<LinkWatch> w(new LinkWatch());
  w->fn_ = std::move(fn);
  w->sock_ = nl_socket_alloc();
  if (!w->sock_) return make_error("nl_socket_alloc");
  nl_socket_disable_seq_check(w->sock_);
  nl_socket_modify_cb(w->sock_, NL_CB_VALID, NL_CB_CUSTOM, &LinkWatch::on_msg, w.get());
  if (int err = nl_connect(w->sock_, NETLINK_ROUTE); err < 0) return nl_err(err, "connect");
  if (int err = nl_socket_add_membership(w->sock_, RTNLGRP_LINK); err < 0)
    return nl_err(err, "subscribe to link events");
  nl_socket_set_nonblocking(w->sock_);
  // A larger receive buffer makes overflow under a burst (a switch reboot takes every
  // link down at once) unlikely; overflow is still handled.
  (void)nl_socket_set_buffer_size(w->sock_, 1 << 20, 0);
  LinkWatch* self = w.get();
  TRY_ASSIGN(w->src_, loop.add_io(nl_socket_get_fd(w->sock_), EPOLLIN,
                                  [self](uint32_t) { self->readable(); }));
  return w;
}

LinkWatch::~LinkWatch() {
  src_.reset();
  if (sock_) nl_socket_free(sock_);
}

int LinkWatch::on_msg(::nl_msg* msg, void* arg) {
  auto* self = static_cast<LinkWatch*>(arg);
  nlmsghdr* h = nlmsg_hdr(msg);
  if ((h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) ||
      !nlmsg_valid_hdr(h, sizeof(ifinfomsg)))
    return NL_OK;
  auto* ifi = static_cast<ifinfomsg*>(nlmsg_data(h));
  LinkEvent e;
  e.ifindex = ifi->ifi_index;
  e.admin_up = (ifi->ifi_flags & IFF_UP) != 0;
  e.carrier = (ifi->ifi_flags & IFF_LOWER_UP) != 0;
  e.removed = h->nlmsg_type == RTM_DELLINK;
  if (nlattr* name = nlmsg_find_attr(h, sizeof(ifinfomsg), IFLA_IFNAME))
    e.ifname = nla_get_string(name);
  self->fn_(e);
  return NL_OK;
}

void LinkWatch::readable() {
  for (;;) {
    int err = nl_recvmsgs_default(sock_);
    if (err >= 0) continue;
    if (err == -NLE_AGAIN) return;
    if (err == -NLE_NOMEM) {  // ENOBUFS: the kernel dropped events
      LinkEvent e;
      e.overflow = true;
      fn_(e);
      continue;
    }
    return;  // a malformed message: skip it, keep the socket
  }
}

}  // namespace weft
