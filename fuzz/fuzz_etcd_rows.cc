// What a control plane replica reads from etcd when it wins the election: a range answer
// as the network delivered it (a protobuf RangeResponse of etcd's gRPC API), its rows parsed, and
// the rows restored into fresh modules. A forged or corrupt etcd must be refused, never crash the
// new leader.
#include <cstdint>
#include <string>

#include "controlplane/store/etcd_client.h"
#include "controlplane/store/etcd_store.h"

using namespace weft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto kvs = etcd::parse_range(text);
  if (!kvs.ok()) return 0;
  cp::StoredState st;
  cp::TaskBuckets::Rows tasks;
  if (!cp::parse_etcd_rows(*kvs, "/weft/state/", &st, &tasks).ok()) return 0;
  cp::Allocator alloc;
  cp::Broker broker{alloc};
  cp::Scheduler sched{alloc};
  (void)cp::StateStore::apply(std::move(st), alloc, broker, sched, 1'000'000,
                              1'700'000'000'000'000);
  return 0;
}
