#include "agent/bridge.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/bridge.h>
#include <netlink/route/link/veth.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>
#include <nftables/libnftables.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/fs.h"

namespace weft::agent {

std::string ipv4_text(uint32_t addr) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{htonl(addr)};
  return ::inet_ntop(AF_INET, &a, buf, sizeof buf) ? buf : "0.0.0.0";
}

// ---------------------------------------------------------------- addresses

AddressPool::AddressPool(uint32_t net, int prefix)
    : net_(net),
      mask_(prefix <= 0 ? 0 : ~uint32_t{0} << (32 - prefix)),
      // net_ + 1 is the bridge's; the broadcast address is no task's.
      pool_(uint64_t{net_} + 2, uint64_t{net_ | ~mask_} - 1) {}

Result<uint32_t> AddressPool::take(const std::string& owner) {
  if (pool_.empty_range()) return make_error("the bridge's subnet has no address for tasks");
  auto n = pool_.take(owner);
  if (!n)
    return make_error("every address of the bridge's subnet (" + ipv4_text(net_) +
                      ") is a live task's");
  return static_cast<uint32_t>(*n);
}

// ---------------------------------------------------------------- the table

std::string nft_table(const std::string& bridge) {
  std::string t = "weft_" + bridge;
  for (char& c : t)
    if (c == '-') c = '_';
  return t;
}

std::string bridge_ruleset_removal(const std::string& bridge) {
  std::string t = nft_table(bridge);
  return "table ip " + t + " {}\ndelete table ip " + t + "\ntable bridge " + t +
         " {}\ndelete table bridge " + t + "\n";
}

std::string bridge_ruleset(const BridgeRules& r) {
  std::string subnet = ipv4_text(r.net) + "/" + std::to_string(r.prefix);
  std::string br = "\"" + r.bridge + "\"";
  std::ostringstream s;
  // Declaring the table first makes the delete succeed when there was none: the whole
  // script is one transaction, so the old table is replaced at once or not at all.
  s << bridge_ruleset_removal(r.bridge);
  s << "table ip " << nft_table(r.bridge) << " {\n";
  s << "  chain publish {\n";
  for (const auto& [task, p] : r.published)
    for (uint16_t port : p.ports)
      for (const char* proto : {"tcp", "udp"})
        s << "    " << proto << " dport " << port << " dnat to " << ipv4_text(p.addr) << ":" << port
          << "\n";
  s << "  }\n";
  // Traffic to one of the machine's addresses, from elsewhere or from a task.
  s << "  chain prerouting {\n"
       "    type nat hook prerouting priority dstnat; policy accept;\n"
       "    fib daddr type local jump publish\n"
       "  }\n";
  // From the machine itself (its own clients, tasks of the host network); not to the
  // loopback's addresses, which cannot be routed to the bridge.
  s << "  chain output {\n"
       "    type nat hook output priority -100; policy accept;\n"
       "    ip daddr != 127.0.0.0/8 fib daddr type local jump publish\n"
       "  }\n";
  // Tasks' outbound traffic leaves with the machine's address; a task that reaches
  // another task's published port through the machine (hairpin) is answered through it.
  s << "  chain postrouting {\n"
       "    type nat hook postrouting priority srcnat; policy accept;\n"
       "    ip saddr "
    << subnet << " oifname != " << br
    << " masquerade\n"
       "    ip saddr "
    << subnet << " oifname " << br
    << " ct status dnat masquerade\n"
       "  }\n";
  // Into the bridge: answers, what a published port lets in, and another task's
  // published port reached directly; nothing else. Out of it: only the subnet's own
  // addresses (a task cannot pretend to be another host). Where br_netfilter passes
  // bridged frames through these hooks, this also filters task-to-task frames.
  s << "  chain forward {\n"
       "    type filter hook forward priority filter; policy accept;\n"
       "    iifname "
    << br << " ip saddr != " << subnet
    << " drop\n"
       "    oifname "
    << br
    << " ct state established,related accept\n"
       "    oifname "
    << br << " ct status dnat accept\n";
  for (const auto& [task, p] : r.published)
    for (uint16_t port : p.ports)
      for (const char* proto : {"tcp", "udp"})
        s << "    oifname " << br << " ip daddr " << ipv4_text(p.addr) << " " << proto << " dport "
          << port << " accept\n";
  s << "    oifname " << br
    << " drop\n"
       "  }\n";
  // The machine itself, from a task: answers, and the ports the operator allows.
  s << "  chain input {\n"
       "    type filter hook input priority filter; policy accept;\n"
       "    iifname "
    << br << " ct state established,related accept\n";
  if (!r.host_ports.empty()) {
    std::string set;
    for (uint16_t p : r.host_ports) set += (set.empty() ? "" : ", ") + std::to_string(p);
    for (const char* proto : {"tcp", "udp"})
      s << "    iifname " << br << " " << proto << " dport { " << set << " } accept\n";
  }
  s << "    iifname " << br
    << " drop\n"
       "  }\n"
       "}\n";
  // Frames from one task's port of the bridge to another's (the bridge's own family, for
  // machines without br_netfilter): ARP, what goes to a published port, and answers
  // from one. The bridge family has no connection tracking here (nf_conntrack_bridge
  // is rarely built), so an answer is told by its shape: from a published TCP port
  // never a bare SYN (a task cannot open a connection to another task's unpublished
  // port by sending from its own published one), from a published UDP port only to a
  // client's ephemeral port (the kernel's default ip_local_port_range, 32768-60999).
  s << "table bridge " << nft_table(r.bridge)
    << " {\n"
       "  chain forward {\n"
       "    type filter hook forward priority filter; policy accept;\n"
       "    iifname \"wv*\" oifname \"wv*\" jump between_tasks\n"
       "  }\n"
       "  chain between_tasks {\n"
       "    ether type arp accept\n";
  for (const auto& [task, p] : r.published)
    for (uint16_t port : p.ports)
      for (const char* proto : {"tcp", "udp"}) {
        s << "    ip daddr " << ipv4_text(p.addr) << " " << proto << " dport " << port
          << " accept\n";
        s << "    ip saddr " << ipv4_text(p.addr) << " " << proto << " sport " << port
          << (proto[0] == 't' ? " tcp flags & (syn | ack) != syn" : " udp dport 32768-60999")
          << " accept\n";
      }
  s << "    drop\n"
       "  }\n"
       "}\n";
  return s.str();
}

// ---------------------------------------------------------------- netlink

namespace {

Error nl_failed(int err, const std::string& what) {
  return make_error(what + ": " + nl_geterror(err)).wrap("rtnetlink");
}

struct Sock {
  nl_sock* s = nullptr;
  ~Sock() {
    if (s) nl_socket_free(s);
  }
};

Status connect(Sock* sk) {
  sk->s = nl_socket_alloc();
  if (!sk->s) return make_error("nl_socket_alloc");
  if (int err = nl_connect(sk->s, NETLINK_ROUTE); err < 0) return nl_failed(err, "connect");
  return {};
}

template <typename T, void (*Put)(T*)>
struct Ref {
  T* p = nullptr;
  ~Ref() {
    if (p) Put(p);
  }
};
using LinkRef = Ref<rtnl_link, rtnl_link_put>;
using AddrRef = Ref<rtnl_addr, rtnl_addr_put>;
using NlAddrRef = Ref<nl_addr, nl_addr_put>;
using RouteRef = Ref<rtnl_route, rtnl_route_put>;

Result<int> ifindex(nl_sock* sk, const std::string& name) {
  LinkRef l;
  if (int err = rtnl_link_get_kernel(sk, 0, name.c_str(), &l.p); err < 0)
    return nl_failed(err, "find " + name);
  return rtnl_link_get_ifindex(l.p);
}

Status set_up(nl_sock* sk, int index, const std::string& name) {
  LinkRef l, change;
  l.p = rtnl_link_alloc();
  change.p = rtnl_link_alloc();
  if (!l.p || !change.p) return make_error("rtnl_link_alloc");
  rtnl_link_set_ifindex(l.p, index);
  rtnl_link_set_flags(change.p, IFF_UP);
  if (int err = rtnl_link_change(sk, l.p, change.p, 0); err < 0)
    return nl_failed(err, "bring " + name + " up");
  return {};
}

// `addr`/`prefix` on the interface; one already there is fine.
Status add_address(nl_sock* sk, int index, uint32_t addr, int prefix, const std::string& name) {
  AddrRef a;
  NlAddrRef local;
  a.p = rtnl_addr_alloc();
  uint32_t be = htonl(addr);
  local.p = nl_addr_build(AF_INET, &be, sizeof be);
  if (!a.p || !local.p) return make_error("rtnl_addr_alloc");
  nl_addr_set_prefixlen(local.p, prefix);
  rtnl_addr_set_ifindex(a.p, index);
  if (int err = rtnl_addr_set_local(a.p, local.p); err < 0) return nl_failed(err, "address");
  int err = rtnl_addr_add(sk, a.p, 0);
  if (err < 0 && err != -NLE_EXIST)
    return nl_failed(err, "give " + name + " " + ipv4_text(addr) + "/" + std::to_string(prefix));
  return {};
}

Status delete_link(nl_sock* sk, const std::string& name) {
  LinkRef l;
  l.p = rtnl_link_alloc();
  if (!l.p) return make_error("rtnl_link_alloc");
  rtnl_link_set_name(l.p, name.c_str());
  int err = rtnl_link_delete(sk, l.p);
  if (err < 0 && err != -NLE_NODEV && err != -NLE_OBJ_NOTFOUND)
    return nl_failed(err, "remove " + name);
  return {};
}

// A netlink socket in the namespace `netns_fd`: this thread enters it for the socket's
// creation and comes back before returning.
Status connect_in(int netns_fd, Sock* sk) {
  Fd home(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!home.valid()) return sys_error("open /proc/thread-self/ns/net");
  if (::setns(netns_fd, CLONE_NEWNET) < 0) return sys_error("enter the task's network namespace");
  Status made = connect(sk);
  if (::setns(home.get(), CLONE_NEWNET) < 0) {
    // The agent's own thread left in a task's namespace would be far worse than a crash.
    std::perror("weft-agent: setns back to the agent's network namespace");
    std::abort();
  }
  return made;
}

}  // namespace

// ---------------------------------------------------------------- Bridge

Result<std::unique_ptr<Bridge>> Bridge::open(const std::string& name, uint32_t net, int prefix,
                                             std::vector<uint16_t> host_ports) {
  std::unique_ptr<Bridge> b(new Bridge());
  b->pool_ = AddressPool(net, prefix);
  b->rules_.bridge = name;
  b->rules_.net = net;
  b->rules_.prefix = prefix;
  b->rules_.host_ports = std::move(host_ports);
  Sock sk;
  TRY(connect(&sk));
  int err = rtnl_link_bridge_add(sk.s, name.c_str());
  if (err < 0 && err != -NLE_EXIST) return nl_failed(err, "make bridge " + name);
  TRY_ASSIGN(b->bridge_index_, ifindex(sk.s, name));
  LinkRef link;
  if (int e = rtnl_link_get_kernel(sk.s, b->bridge_index_, nullptr, &link.p); e < 0)
    return nl_failed(e, "read " + name);
  if (!rtnl_link_is_bridge(link.p))
    return make_error(name + " exists and is not a bridge (agent.toml [bridge] name)");
  TRY(add_address(sk.s, b->bridge_index_, b->pool_.gateway(), prefix, name));
  TRY(set_up(sk.s, b->bridge_index_, name));
  // The bridge is IPv4 only: without this its IPv6 link-local address would let a task
  // reach the machine's services that listen on "::", past the IPv4 rules.
  std::string no_v6 = "/proc/sys/net/ipv6/conf/" + name + "/disable_ipv6";
  if (::access(no_v6.c_str(), F_OK) == 0)
    TRY_CTX(write_file(no_v6, "1\n"), "turn off IPv6 on " + name);
  // Forwarding is per network namespace: the agent's (the machine's, in production).
  TRY_CTX(write_file("/proc/sys/net/ipv4/ip_forward", "1\n"), "turn on IPv4 forwarding");
  b->nft_ = nft_ctx_new(NFT_CTX_DEFAULT);
  if (!b->nft_) return make_error("nft_ctx_new");
  nft_ctx_buffer_output(b->nft_);
  nft_ctx_buffer_error(b->nft_);
  return b;
}

Bridge::~Bridge() {
  if (nft_) nft_ctx_free(nft_);
}

std::string Bridge::veth_name(uint32_t addr) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "wv%08x", addr);
  return buf;
}

Status Bridge::attach(int netns_fd, uint32_t addr) {
  std::string host = veth_name(addr);
  Sock sk;
  TRY(connect(&sk));
  // A previous incarnation's namespace may still be going away with its veth.
  TRY(delete_link(sk.s, host));
  LinkRef veth;
  veth.p = rtnl_link_veth_alloc();
  if (!veth.p) return make_error("rtnl_link_veth_alloc");
  rtnl_link_set_name(veth.p, host.c_str());
  rtnl_link_set_master(veth.p, bridge_index_);
  {
    LinkRef peer;
    peer.p = rtnl_link_veth_get_peer(veth.p);
    if (!peer.p) return make_error("rtnl_link_veth_get_peer");
    rtnl_link_set_name(peer.p, "eth0");
    rtnl_link_set_ns_fd(peer.p, netns_fd);
  }
  if (int err = rtnl_link_add(sk.s, veth.p, NLM_F_CREATE | NLM_F_EXCL); err < 0)
    return nl_failed(err, "make veth " + host);
  auto configured = [&]() -> Status {
    TRY_ASSIGN(int index, ifindex(sk.s, host));
    TRY(set_up(sk.s, index, host));
    Sock inside;
    TRY(connect_in(netns_fd, &inside));
    TRY_ASSIGN(int eth0, ifindex(inside.s, "eth0"));
    TRY(add_address(inside.s, eth0, addr, rules_.prefix, "eth0"));
    TRY(set_up(inside.s, eth0, "eth0"));
    RouteRef route;
    NlAddrRef dst, gw;
    route.p = rtnl_route_alloc();
    uint32_t any = 0, gateway = htonl(pool_.gateway());
    dst.p = nl_addr_build(AF_INET, &any, sizeof any);
    gw.p = nl_addr_build(AF_INET, &gateway, sizeof gateway);
    rtnl_nexthop* nh = rtnl_route_nh_alloc();
    if (!route.p || !dst.p || !gw.p || !nh) {
      if (nh) rtnl_route_nh_free(nh);
      return make_error("rtnl_route_alloc");
    }
    nl_addr_set_prefixlen(dst.p, 0);
    rtnl_route_set_family(route.p, AF_INET);
    rtnl_route_set_dst(route.p, dst.p);
    rtnl_route_nh_set_gateway(nh, gw.p);
    rtnl_route_nh_set_ifindex(nh, eth0);
    rtnl_route_add_nexthop(route.p, nh);  // the route owns it now
    if (int err = rtnl_route_add(inside.s, route.p, NLM_F_CREATE); err < 0)
      return nl_failed(err, "default route via " + ipv4_text(pool_.gateway()));
    return {};
  }();
  if (!configured.ok()) (void)delete_link(sk.s, host);
  return configured;
}

Status Bridge::run_nft(const std::string& script) {
  if (nft_run_cmd_from_buffer(nft_, script.c_str()) != 0) {
    std::string why = nft_ctx_get_error_buffer(nft_);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    return make_error("nftables refused the bridge's table: " + why.substr(0, 2048));
  }
  return {};
}

Status Bridge::publish(const std::map<std::string, Published>& tasks) {
  if (published_once_ && tasks == rules_.published) return {};
  BridgeRules next = rules_;
  next.published = tasks;
  TRY(run_nft(bridge_ruleset(next)));
  rules_ = std::move(next);
  published_once_ = true;
  return {};
}

Result<int> Bridge::sweep() {
  Sock sk;
  TRY(connect(&sk));
  nl_cache* cache = nullptr;
  if (int err = rtnl_link_alloc_cache(sk.s, AF_UNSPEC, &cache); err < 0)
    return nl_failed(err, "list links");
  std::vector<std::string> stale;
  for (nl_object* o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o)) {
    auto* l = reinterpret_cast<rtnl_link*>(o);
    const char* n = rtnl_link_get_name(l);
    unsigned addr = 0;
    char tail = 0;
    if (rtnl_link_get_master(l) != bridge_index_ || !n ||
        std::sscanf(n, "wv%8x%c", &addr, &tail) != 1 || veth_name(addr) != n)
      continue;
    if (!pool_.contains(addr)) {
      stale.push_back(n);
      continue;
    }
    if (!pool_.in_use(addr)) stale.push_back(n);  // a live task's otherwise
  }
  nl_cache_free(cache);
  for (const auto& n : stale) TRY(delete_link(sk.s, n));
  return static_cast<int>(stale.size());
}

}  // namespace weft::agent
