// A fake cgroupfs for unit tests only (not linked into weft-agent): a directory tree
// under a temporary directory that emulates enough of the kernel's behaviour. Directories
// made by mkdir get cgroup.procs, cgroup.events, cgroup.controllers (the parent's
// subtree_control), cgroup.subtree_control, cgroup.freeze and cgroup.kill.
#pragma once

#include <memory>

#include "agent/cgroup.h"

namespace weft::agent {

std::unique_ptr<CgroupFs> make_fake_cgroupfs();

}  // namespace weft::agent
