// What a region's roles read back from etcd (controlplane/region/region.h): an entitlement's
// home and a machine's holder as stored values, and a whole range of homes as the network
// delivered it (a protobuf RangeResponse). A forged or corrupt etcd must be refused with
// the key named, never crash a front end or a shard.
#include <cstdint>
#include <string>

#include "controlplane/region/records.h"
#include "controlplane/store/etcd_client.h"

using namespace weft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)cp::parse_entitlement_home("/r/entitlements/web", text);
  auto h = cp::parse_machine_holder("/r/machines/m1", text);
  if (h.ok()) {  // what is accepted is written back the same
    auto again = cp::parse_machine_holder("k", cp::machine_holder_value(*h));
    if (!again.ok() || again->holder != h->holder || again->epoch != h->epoch ||
        again->broker != h->broker)
      __builtin_trap();
  }
  auto kvs = etcd::parse_range(text);
  if (kvs.ok()) (void)cp::parse_entitlement_homes("/weft-region/", *kvs);
  return 0;
}
