// Network links, the sidekick's other door to the host: rtnetlink (libnl-route) for MTU
// and txqueuelen, the ethtool generic-netlink family (libnl-genl) for channel counts.
// Never spawns ip or ethtool. A sysfs implementation serves fake trees in tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/paths.h"
#include "common/result.h"

namespace weft::sidekick {

class Links {
 public:
  virtual ~Links() = default;
  virtual Result<std::vector<std::string>> names() = 0;
  // field: "mtu", "txqueuelen", "channels.combined", "channels.rx", "channels.tx",
  // "channels.other"
  virtual Result<std::string> read(const std::string& ifname, const std::string& field) = 0;
  virtual Status write(const std::string& ifname, const std::string& field,
                       const std::string& value) = 0;
};

// Talks to the kernel of the calling thread's network namespace.
Result<std::unique_ptr<Links>> make_netlink_links();
// /sys/class/net/<if>/{mtu,tx_queue_len} under a (fake) root; no channels.
std::unique_ptr<Links> make_sysfs_links(HostPaths host);

}  // namespace weft::sidekick
