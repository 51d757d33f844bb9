// service.watch (docs/services.md): Consul's blocking query over the service table. A
// watch is answered at once when the table (or the one job asked about) changed since
// the caller's `index`, else when it changes or `wait_ms` passes (at most a minute; the
// deadlines are looked at every second). At most 1,024 watches wait at once; one more is
// refused as unavailable, to be tried again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/discovery/service_table.h"

namespace weft::cp {

class ServiceWatches {
 public:
  ServiceWatches(EventLoop& loop, const ServiceTable& table) : loop_(loop), table_(table) {}
  // service.watch: the answer now, or null when the reply is deferred on c.session.
  Result<nlohmann::json> watch(const nlohmann::json& p, const rpc::CallContext& c);
  // The table may have changed: the watches it concerns (and those whose time is up) are
  // answered.
  void table_changed();

 private:
  nlohmann::json answer(const std::string& job) const;
  // Answers the watches whose time is up and keeps the rest; with `changed`, also those
  // whose job changed since their index.
  void answer_due(bool changed);
  void expire();

  struct Watcher {
    rpc::ReplyFn reply;
    std::string job;
    uint64_t index = 0;
    uint64_t deadline_us = 0;
  };
  EventLoop& loop_;
  const ServiceTable& table_;
  std::vector<Watcher> watchers_;
  Source timer_;  // the deadlines' check, armed while a watch waits
  bool armed_ = false;
};

}  // namespace weft::cp
