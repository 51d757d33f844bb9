// A TaskController's answers to taskcontrol.plan as the control plane reads them (the
// line's JSON, then the answer's form), and the reference controller's decisions on a
// plan: a hostile peer on either side of the protocol.
#include <cstdint>
#include <string>

#include "common/json_bounded.h"
#include "controlplane/taskcontrol/links.h"
#include "examples/shard_controller/shard_manager.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto j = weft::parse_json_bounded(text);
  if (!j.ok()) return 0;
  (void)weft::cp::parse_plan_answer(*j, 1);
  if (j->is_object()) {
    weft::example::ShardManager m(7, 3, 2);
    (void)m.decide(*j);
    (void)m.decide(*j);  // with what the first answer left in flight
  }
  return 0;
}
