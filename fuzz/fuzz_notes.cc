// What a new leader reads back as the last leader's notes (controlplane/store/notes.h):
// a map of keys to JSON documents as the store returns it (here the JSON text of one
// object), each feature's part given to its restore, then saved again. A forged or
// corrupt note must be dropped, never crash the new leader or be trusted.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "controlplane/entitlements/profile_rolls.h"
#include "controlplane/jobs/job_events.h"
#include "controlplane/store/notes.h"
#include "controlplane/tend/autoscaler.h"
#include "controlplane/tend/rebalancer.h"

using namespace weft;
using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<EventLoop> loop = std::move(EventLoop::create()).value();
  json doc = json::parse(data, data + size, nullptr, false);
  if (!doc.is_object()) return 0;
  std::map<std::string, json> all;
  for (auto& [key, value] : doc.items())
    if (cp::Notes::valid_key(key)) all[key] = value;
  cp::Notes notes;
  notes.set_loaded(all);

  cp::JobEvents events;
  events.restore(notes.take_loaded(cp::JobEvents::kNotePrefix), notes);
  events.record("web", {0, 1, "web.0.1", "m0", "placed", ""});
  events.save(notes);
  uint64_t next = 0;
  (void)events.list("web", 0, 1000, &next);

  cp::Allocator alloc;
  cp::Broker broker{alloc};
  cp::Scheduler sched{alloc};
  auto e = broker.entitlements().create(cp::EntitlementSpec{"web", 2, "new", "", {}, {}});
  for (const char* id : {"m0", "m1"}) {
    auto m = broker.register_machine({id, "dc1", id, "a", {4000, 8192}}, 0);
    if (m.ok() && e.ok()) (void)alloc.assign(*m, *e);
  }
  cp::ProfileRolls rolls{alloc, broker, notes};
  rolls.restore(notes.take_loaded(cp::ProfileRolls::kNotePrefix));
  (void)rolls.advance();

  cp::Rebalancer rebalancer{*loop, alloc, sched, cp::Rebalancer::Options{}, {}, &notes};
  rebalancer.restore(notes.take_loaded(cp::Rebalancer::kNotePrefix), 5'000'000,
                     1'700'000'000'000'000);
  if (e.ok()) (void)rebalancer.status({*e, "web", false, ""});

  for (const auto& [key, value] : notes.take_loaded("autoscale")) {
    cp::AutoscalePolicy p;
    p.max = 10;
    p.predictive = true;
    cp::Autoscaler a(p);
    a.restore(value.is_object() ? value.value("scaler", json()) : json(), value);
    (void)a.decide(1'700'000'000'000'000, 2, 10);
    (void)a.predict(1'700'000'300'000'000);
  }
  (void)notes.take();
  return 0;
}
