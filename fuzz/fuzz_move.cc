// What a shard reads when an entitlement moves to it (controlplane/region/move_doc.h): the
// document the old shard wrote, carried over the network by a front end, and the move's
// record in etcd (controlplane/region/region.h). Both are hostile: refused with the field or key
// named, never a crash; what is accepted is written back and read again the same.
#include <cstdint>
#include <string>

#include "common/json_bounded.h"
#include "controlplane/region/move_doc.h"
#include "controlplane/region/records.h"

using namespace weft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto rec = cp::parse_move("/r/moves/web", text);
  if (rec.ok()) {
    auto again = cp::parse_move("k", cp::move_value(*rec));
    if (!again.ok() || again->from != rec->from || again->to != rec->to ||
        again->step != rec->step || again->beat_us != rec->beat_us)
      __builtin_trap();
  }
  auto j = parse_json_bounded(text);
  if (!j.ok()) return 0;
  auto doc = cp::parse_move_doc(*j);
  if (!doc.ok()) return 0;
  nlohmann::json written = cp::move_doc_to_json(*doc);
  auto back = cp::parse_move_doc(written);
  if (!back.ok() || cp::move_doc_to_json(*back) != written) __builtin_trap();
  return 0;
}
