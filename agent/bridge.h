// The machine's bridge for tasks with namespaces.network = "bridge" (docs/networking.md).
//
// Each such task's network namespace gets a veth pair: "eth0" inside, with an address of
// the bridge's subnet and a default route through the bridge; the host end a port of
// the bridge. Two nftables tables of the agent's own (`ip weft_<bridge>` and `bridge
// weft_<bridge>`) publish each task's named ports on the machine's addresses (DNAT, for
// traffic from elsewhere and from the machine itself), masquerade the tasks' outbound
// traffic, let a task reach the machine itself only on the ports agent.toml allows, and
// another task only on its published ports. (Not the bridge's port isolation: where
// br_netfilter is loaded, a DNAT to a task on the same bridge is bridged, not routed,
// and isolation would drop it.) The tables are written whole, in one transaction, each
// time the set of published tasks changes: nothing half-applied, and a restarted agent
// puts back exactly what its live tasks need. A task's veth dies
// with its namespace; its address is kept in its record for its whole life (restarts
// and agent restarts included), and handed to another task only after it is gone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/range_pool.h"
#include "common/result.h"

struct nft_ctx;

namespace weft::agent {

std::string ipv4_text(uint32_t addr);  // host byte order -> "A.B.C.D"

// The addresses of the bridge's subnet: the first is the bridge's, the last the
// broadcast; the others go to tasks, in turn (a freed address comes back last).
class AddressPool {
 public:
  AddressPool(uint32_t net, int prefix);
  uint32_t gateway() const { return net_ + 1; }
  bool contains(uint32_t addr) const { return (addr & mask_) == net_; }
  // An address for `owner` (the one it holds already, if any); an error when none is free.
  Result<uint32_t> take(const std::string& owner);
  // A restarted agent's: `owner` holds `addr` again. False if it is not a task address
  // of the subnet, or another owner holds it.
  bool hold(uint32_t addr, const std::string& owner) { return pool_.hold(addr, owner); }
  void release(const std::string& owner) { pool_.release(owner); }
  bool in_use(uint32_t addr) const { return pool_.in_use(addr); }
  size_t held() const { return pool_.held(); }

 private:
  uint32_t net_, mask_;
  RangePool pool_;  // the task addresses: .2 to the one before broadcast
};

// What the table publishes for one task: its address and its ports (each TCP and UDP,
// the same number on the machine and in the task).
struct Published {
  uint32_t addr = 0;
  std::vector<uint16_t> ports;
  bool operator==(const Published&) const = default;
};

struct BridgeRules {
  std::string bridge;
  uint32_t net = 0;
  int prefix = 0;
  std::vector<uint16_t> host_ports;            // reachable on the machine from a task
  std::map<std::string, Published> published;  // by task id
};

// The table's name for a bridge ("weft_" and the name, '-' as '_').
std::string nft_table(const std::string& bridge);
// The whole table as an nft script that replaces the old one in one transaction.
std::string bridge_ruleset(const BridgeRules& r);
// An nft script that removes the table (nothing if it is not there).
std::string bridge_ruleset_removal(const std::string& bridge);

class Bridge {
 public:
  // Makes the bridge (or takes the one a previous agent made), gives it the subnet's
  // first address, brings it up and turns on IPv4 forwarding in the agent's network
  // namespace. The table is left as it is until publish().
  static Result<std::unique_ptr<Bridge>> open(const std::string& name, uint32_t net, int prefix,
                                              std::vector<uint16_t> host_ports);
  ~Bridge();
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;

  AddressPool& addresses() { return pool_; }
  const std::string& name() const { return rules_.bridge; }
  int prefix() const { return rules_.prefix; }

  // Plugs the namespace `netns_fd` into the bridge with `addr`: a veth pair (the host
  // end named for the address; one left from the task's previous incarnation is removed
  // first), eth0 inside with the address and a default route, the host end a port of the
  // bridge. Called before the task's program runs.
  Status attach(int netns_fd, uint32_t addr);
  // Writes the table for exactly these tasks, if they differ from what it holds.
  Status publish(const std::map<std::string, Published>& tasks);
  // The host end of the veth for an address.
  static std::string veth_name(uint32_t addr);
  // Removes host ends on the bridge whose address is not held (a start cut short by a
  // crash); how many.
  Result<int> sweep();

 private:
  Bridge() : pool_(0, 32) {}
  Status run_nft(const std::string& script);

  AddressPool pool_;
  BridgeRules rules_;
  bool published_once_ = false;
  int bridge_index_ = 0;
  ::nft_ctx* nft_ = nullptr;
};

}  // namespace weft::agent
