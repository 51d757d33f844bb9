#include "sidekick/links.h"

#include <linux/ethtool_netlink.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/netlink.h>
#include <netlink/route/link.h>

#include <algorithm>
#include <map>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::sidekick {

namespace {

Error nl_error(int err, const std::string& what) {
  return make_error(what + ": " + nl_geterror(err)).wrap("netlink");
}

struct SockDeleter {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};
using Sock = std::unique_ptr<nl_sock, SockDeleter>;
struct LinkDeleter {
  void operator()(rtnl_link* l) const { rtnl_link_put(l); }
};
using Link = std::unique_ptr<rtnl_link, LinkDeleter>;
struct MsgDeleter {
  void operator()(nl_msg* m) const { nlmsg_free(m); }
};
using Msg = std::unique_ptr<nl_msg, MsgDeleter>;

int channel_attr(const std::string& field) {
  if (field == "channels.combined") return ETHTOOL_A_CHANNELS_COMBINED_COUNT;
  if (field == "channels.rx") return ETHTOOL_A_CHANNELS_RX_COUNT;
  if (field == "channels.tx") return ETHTOOL_A_CHANNELS_TX_COUNT;
  if (field == "channels.other") return ETHTOOL_A_CHANNELS_OTHER_COUNT;
  return -1;
}

// Installs a message callback for one request and removes it when the request is done,
// whatever the outcome, so a later reply can never reach a callback whose data is gone.
class ScopedValidCb {
 public:
  ScopedValidCb(nl_sock* s, nl_recvmsg_msg_cb_t fn, void* arg) : s_(s) {
    nl_socket_modify_cb(s_, NL_CB_VALID, NL_CB_CUSTOM, fn, arg);
  }
  ~ScopedValidCb() { nl_socket_modify_cb(s_, NL_CB_VALID, NL_CB_DEFAULT, nullptr, nullptr); }
  ScopedValidCb(const ScopedValidCb&) = delete;
  ScopedValidCb& operator=(const ScopedValidCb&) = delete;

 private:
  nl_sock* s_;
};

int ring_attr(const std::string& field) {
  if (field == "rings.rx") return ETHTOOL_A_RINGS_RX;
  if (field == "rings.rx-mini") return ETHTOOL_A_RINGS_RX_MINI;
  if (field == "rings.rx-jumbo") return ETHTOOL_A_RINGS_RX_JUMBO;
  if (field == "rings.tx") return ETHTOOL_A_RINGS_TX;
  return -1;
}

class NetlinkLinks : public Links {
 public:
  NetlinkLinks(Sock route, Sock genl, int family)
      : route_(std::move(route)), genl_(std::move(genl)), ethtool_family_(family) {}

  Result<std::vector<std::string>> names() override {
    nl_cache* cache = nullptr;
    int err = rtnl_link_alloc_cache(route_.get(), AF_UNSPEC, &cache);
    if (err < 0) return nl_error(err, "list links");
    std::vector<std::string> out;
    for (nl_object* o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o))
      out.push_back(rtnl_link_get_name(reinterpret_cast<rtnl_link*>(o)));
    nl_cache_free(cache);
    std::sort(out.begin(), out.end());
    return out;
  }

  Result<std::string> read(const std::string& ifname, const std::string& field) override {
    if (field.rfind("features.", 0) == 0) {
      TRY_ASSIGN(auto active, get_features(ifname));
      auto it = active.find(field.substr(9));
      if (it == active.end())
        return errno_error(EOPNOTSUPP, ifname + " has no feature " + field.substr(9));
      return std::string(it->second ? "on" : "off");
    }
    if (field.rfind("rings.", 0) == 0) {
      TRY_ASSIGN(auto counts, get_counts(ETHTOOL_MSG_RINGS_GET, ETHTOOL_A_RINGS_MAX, ifname));
      int attr = ring_attr(field);
      if (attr < 0 || counts[static_cast<size_t>(attr)] < 0)
        return errno_error(EOPNOTSUPP, ifname + " reports no " + field);
      return std::to_string(counts[static_cast<size_t>(attr)]);
    }
    if (field.rfind("channels.", 0) == 0) {
      TRY_ASSIGN(auto counts, get_channels(ifname));
      int attr = channel_attr(field);
      if (attr < 0 || counts[attr] < 0)
        return errno_error(EOPNOTSUPP, ifname + " reports no " + field);
      return std::to_string(counts[attr]);
    }
    TRY_ASSIGN(Link link, get(ifname));
    if (field == "mtu") return std::to_string(rtnl_link_get_mtu(link.get()));
    if (field == "txqueuelen") return std::to_string(rtnl_link_get_txqlen(link.get()));
    return errno_error(EINVAL, "unknown link field " + field);
  }

  Status write(const std::string& ifname, const std::string& field,
               const std::string& value) override {
    if (field.rfind("features.", 0) == 0)
      return set_feature(ifname, field.substr(9), value == "on");
    unsigned v = static_cast<unsigned>(std::stoul(value));
    if (field.rfind("channels.", 0) == 0)
      return set_count(ETHTOOL_MSG_CHANNELS_SET, ifname, channel_attr(field), v);
    if (field.rfind("rings.", 0) == 0)
      return set_count(ETHTOOL_MSG_RINGS_SET, ifname, ring_attr(field), v);
    TRY_ASSIGN(Link link, get(ifname));
    Link change(rtnl_link_alloc());
    if (field == "mtu")
      rtnl_link_set_mtu(change.get(), v);
    else if (field == "txqueuelen")
      rtnl_link_set_txqlen(change.get(), v);
    else
      return errno_error(EINVAL, "unknown link field " + field);
    int err = rtnl_link_change(route_.get(), link.get(), change.get(), 0);
    if (err < 0) return nl_error(err, "set " + field + " of " + ifname);
    return {};
  }

 private:
  Result<Link> get(const std::string& ifname) {
    rtnl_link* l = nullptr;
    int err = rtnl_link_get_kernel(route_.get(), 0, ifname.c_str(), &l);
    if (err < 0) return nl_error(err, "link " + ifname);
    return Link(l);
  }

  Result<Msg> ethtool_msg(uint8_t cmd, int flags, const std::string& ifname) {
    if (ethtool_family_ < 0)
      return errno_error(EOPNOTSUPP, "the kernel has no ethtool netlink family");
    Msg m(nlmsg_alloc());
    if (!genlmsg_put(m.get(), NL_AUTO_PORT, NL_AUTO_SEQ, ethtool_family_, 0, flags, cmd,
                     ETHTOOL_GENL_VERSION))
      return make_error("genlmsg_put");
    nlattr* hdr = nla_nest_start(m.get(), ETHTOOL_A_CHANNELS_HEADER | NLA_F_NESTED);
    nla_put_string(m.get(), ETHTOOL_A_HEADER_DEV_NAME, ifname.c_str());
    nla_nest_end(m.get(), hdr);
    return m;
  }

  // u32 attributes of a CHANNELS_GET or RINGS_GET reply by number; -1 where absent.
  Result<std::vector<int64_t>> get_counts(uint8_t cmd, int max_attr, const std::string& ifname) {
    TRY_ASSIGN(Msg m, ethtool_msg(cmd, 0, ifname));
    int err = nl_send_auto(genl_.get(), m.get());
    if (err < 0) return nl_error(err, "query " + ifname);
    struct Out {
      std::vector<int64_t> counts;
      int max;
    } out{std::vector<int64_t>(static_cast<size_t>(max_attr) + 1, -1), max_attr};
    auto parse = [](nl_msg* msg, void* arg) -> int {
      auto* o = static_cast<Out*>(arg);
      std::vector<nlattr*> attrs(static_cast<size_t>(o->max) + 1, nullptr);
      if (genlmsg_parse(nlmsg_hdr(msg), 0, attrs.data(), o->max, nullptr) < 0) return NL_SKIP;
      for (int a = 2; a <= o->max; ++a)  // 1 is the header
        if (attrs[static_cast<size_t>(a)] && nla_len(attrs[static_cast<size_t>(a)]) == 4)
          o->counts[static_cast<size_t>(a)] = nla_get_u32(attrs[static_cast<size_t>(a)]);
      return NL_OK;
    };
    ScopedValidCb cb(genl_.get(), parse, &out);
    err = nl_recvmsgs_default(genl_.get());
    // libnl asks for an ACK after the reply; consume it so the next request starts clean.
    if (err >= 0) err = nl_wait_for_ack(genl_.get());
    if (err < 0) return nl_error(err, "query " + ifname);
    return out.counts;
  }
  Result<std::vector<int64_t>> get_channels(const std::string& ifname) {
    return get_counts(ETHTOOL_MSG_CHANNELS_GET, ETHTOOL_A_CHANNELS_MAX, ifname);
  }

  Status set_count(uint8_t cmd, const std::string& ifname, int attr, unsigned v) {
    if (attr < 0) return errno_error(EINVAL, "unknown count");
    TRY_ASSIGN(Msg m, ethtool_msg(cmd, NLM_F_ACK, ifname));
    nla_put_u32(m.get(), attr, v);
    int err = nl_send_auto(genl_.get(), m.get());
    if (err >= 0) err = nl_wait_for_ack(genl_.get());
    if (err < 0) return nl_error(err, "set " + ifname);
    return {};
  }

  // Offload features by name ("rx-gro") and whether they are active, from the verbose
  // (named) form of the ETHTOOL_A_FEATURES_ACTIVE bitset.
  Result<std::map<std::string, bool>> get_features(const std::string& ifname) {
    TRY_ASSIGN(Msg m, ethtool_msg(ETHTOOL_MSG_FEATURES_GET, 0, ifname));
    int err = nl_send_auto(genl_.get(), m.get());
    if (err < 0) return nl_error(err, "features of " + ifname);
    std::map<std::string, bool> active;
    auto parse = [](nl_msg* msg, void* arg) -> int {
      auto* out = static_cast<std::map<std::string, bool>*>(arg);
      nlattr* attrs[ETHTOOL_A_FEATURES_MAX + 1];
      if (genlmsg_parse(nlmsg_hdr(msg), 0, attrs, ETHTOOL_A_FEATURES_MAX, nullptr) < 0)
        return NL_SKIP;
      // Each bitset lists bit names; in a value-only (NOMASK) set the listed bits are the
      // ones set, otherwise VALUE says so. HW = features that can change, ACTIVE = on.
      auto names = [](nlattr* set, bool* any) {
        std::map<std::string, bool> bits;
        nlattr* bitset[ETHTOOL_A_BITSET_MAX + 1];
        if (!set || nla_parse_nested(bitset, ETHTOOL_A_BITSET_MAX, set, nullptr) < 0 ||
            !bitset[ETHTOOL_A_BITSET_BITS])
          return bits;
        bool nomask = bitset[ETHTOOL_A_BITSET_NOMASK] != nullptr;
        nlattr* bit;
        int rem;
        nla_for_each_nested(bit, bitset[ETHTOOL_A_BITSET_BITS], rem) {
          nlattr* b[ETHTOOL_A_BITSET_BIT_MAX + 1];
          if (nla_parse_nested(b, ETHTOOL_A_BITSET_BIT_MAX, bit, nullptr) < 0 ||
              !b[ETHTOOL_A_BITSET_BIT_NAME])
            continue;
          bits[nla_get_string(b[ETHTOOL_A_BITSET_BIT_NAME])] =
              nomask || b[ETHTOOL_A_BITSET_BIT_VALUE] != nullptr;
          *any = true;
        }
        return bits;
      };
      bool any = false;
      for (const auto& [name, on] : names(attrs[ETHTOOL_A_FEATURES_HW], &any)) (*out)[name] = false;
      for (const auto& [name, on] : names(attrs[ETHTOOL_A_FEATURES_ACTIVE], &any))
        (*out)[name] = on;
      return NL_OK;
    };
    ScopedValidCb cb(genl_.get(), parse, &active);
    err = nl_recvmsgs_default(genl_.get());
    if (err >= 0) err = nl_wait_for_ack(genl_.get());
    if (err < 0) return nl_error(err, "features of " + ifname);
    return active;
  }

  Status set_feature(const std::string& ifname, const std::string& name, bool on) {
    TRY_ASSIGN(Msg m, ethtool_msg(ETHTOOL_MSG_FEATURES_SET, NLM_F_ACK, ifname));
    nlattr* wanted = nla_nest_start(m.get(), ETHTOOL_A_FEATURES_WANTED | NLA_F_NESTED);
    nlattr* bits = nla_nest_start(m.get(), ETHTOOL_A_BITSET_BITS | NLA_F_NESTED);
    nlattr* bit = nla_nest_start(m.get(), ETHTOOL_A_BITSET_BITS_BIT | NLA_F_NESTED);
    nla_put_string(m.get(), ETHTOOL_A_BITSET_BIT_NAME, name.c_str());
    if (on) nla_put_flag(m.get(), ETHTOOL_A_BITSET_BIT_VALUE);
    nla_nest_end(m.get(), bit);
    nla_nest_end(m.get(), bits);
    nla_nest_end(m.get(), wanted);
    int err = nl_send_auto(genl_.get(), m.get());
    if (err >= 0) err = nl_wait_for_ack(genl_.get());
    if (err < 0) return nl_error(err, "set feature " + name + " of " + ifname);
    return {};
  }

  Sock route_, genl_;
  int ethtool_family_;
};

class SysfsLinks : public Links {
 public:
  explicit SysfsLinks(HostPaths host) : host_(std::move(host)) {}
  Result<std::vector<std::string>> names() override {
    TRY_ASSIGN(auto n, list_dir(host_.sys("class/net")));
    std::sort(n.begin(), n.end());
    return n;
  }
  Result<std::string> read(const std::string& ifname, const std::string& field) override {
    TRY_ASSIGN(std::string path, file(ifname, field));
    TRY_ASSIGN(std::string v, read_file(path));
    return trim(v);
  }
  Status write(const std::string& ifname, const std::string& field,
               const std::string& value) override {
    TRY_ASSIGN(std::string path, file(ifname, field));
    return write_file(path, value);
  }

 private:
  Result<std::string> file(const std::string& ifname, const std::string& field) {
    if (field == "mtu") return host_.sys("class/net/" + ifname + "/mtu");
    if (field == "txqueuelen") return host_.sys("class/net/" + ifname + "/tx_queue_len");
    return errno_error(EOPNOTSUPP, field + " needs netlink");
  }
  HostPaths host_;
};

}  // namespace

Result<std::unique_ptr<Links>> make_netlink_links() {
  Sock route(nl_socket_alloc()), genl(nl_socket_alloc());
  if (!route || !genl) return make_error("nl_socket_alloc");
  int err = nl_connect(route.get(), NETLINK_ROUTE);
  if (err < 0) return nl_error(err, "connect rtnetlink");
  err = genl_connect(genl.get());
  if (err < 0) return nl_error(err, "connect generic netlink");
  int family = genl_ctrl_resolve(genl.get(), ETHTOOL_GENL_NAME);  // < 0: no ethtool netlink
  return std::unique_ptr<Links>(new NetlinkLinks(std::move(route), std::move(genl), family));
}

std::unique_ptr<Links> make_sysfs_links(HostPaths host) {
  return std::make_unique<SysfsLinks>(std::move(host));
}

}  // namespace weft::sidekick
