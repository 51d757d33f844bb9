// The region's parts of a broker or a shard (docs/regions.md), made when it leads
// (RegionCalls::start_region, load_moves): its lending of machines, its services across
// the region's shards, its checks of the front ends' word against etcd, and its side of
// entitlements' moves. Outside a region all are unset.
#pragma once

#include <memory>

#include "controlplane/discovery/region_services.h"
#include "controlplane/region/checks.h"
#include "controlplane/region/lending.h"
#include "controlplane/region/shard_moves.h"

namespace weft::cp {

struct RegionParts {
  std::unique_ptr<Lending> lending;
  std::unique_ptr<RegionServices> services;
  // The checks before `moves`, which uses them: destroyed after it.
  std::unique_ptr<RegionChecks> checks;
  std::unique_ptr<EntitlementMoves> moves;
};

}  // namespace weft::cp
