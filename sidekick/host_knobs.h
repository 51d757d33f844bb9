// The sidekick's door to the host: reads and writes each knob family through procfs,
// sysfs and cgroupfs under a HostPaths root (a fake tree in tests). Globs in nic and irq
// knobs are expanded here into one knob per interface or IRQ.
#pragma once

#include <string>
#include <vector>

#include <memory>

#include "common/paths.h"
#include "common/result.h"
#include "sidekick/links.h"
#include "sidekick/profile.h"

namespace weft::sidekick {

class HostKnobs {
 public:
  // workload_cgroup: the cgroup whose subtree_control `cgroup` knobs change (absolute).
  // links: how nic knobs reach the kernel (netlink in production); null means sysfs
  // under the host root, for fake trees.
  HostKnobs(HostPaths host, std::string workload_cgroup, std::unique_ptr<Links> links = nullptr)
      : host_(std::move(host)),
        workload_cgroup_(std::move(workload_cgroup)),
        links_(links ? std::move(links) : make_sysfs_links(host_)) {}
  virtual ~HostKnobs() = default;

  // nic "eth*/mtu" -> "eth0/mtu", "eth1/mtu"; irq "virtio0-input.*" -> "24", "25".
  // A glob that matches nothing is an error for a required knob, dropped otherwise.
  Result<std::vector<Knob>> expand(const std::vector<Knob>& knobs) const;
  // The current value in the knob's canonical form ("madvise", "on", "512", "0-3").
  virtual Result<std::string> read(const std::string& family, const std::string& key) const;
  virtual Status write(const std::string& family, const std::string& key, const std::string& value);

 private:
  Result<std::string> path_of(const std::string& family, const std::string& key) const;
  std::vector<std::string> per_cpu_files(const std::string& name) const;
  HostPaths host_;
  std::string workload_cgroup_;
  std::unique_ptr<Links> links_;
};

}  // namespace weft::sidekick
