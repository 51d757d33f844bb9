// The control plane's side of service discovery (docs/services.md): the endpoints of
// every job kept in step with the scheduler (ServiceTable, services.h), pushed to every
// agent that answers DNS, the stops that wait until those agents have the task
// withdrawn (and the job's discovery_drain), and the service.* methods (service.watch:
// Consul's blocking query).
//
// The Manager owns one and tells it little: which agents subscribe and where each
// machine's tasks are reached, the commands it is about to send (refresh: the stops
// among them may be held), and it reads the scheduler, allocator and broker it is given.
// Stops released later go back through `dispatch`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/metrics.h"
#include "common/result.h"
#include "common/rpc/session.h"
#include "controlplane/discovery/service_table.h"
#include "controlplane/discovery/service_watches.h"
#include "controlplane/machines/broker.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

class Discovery {
 public:
  struct Options {
    uint64_t ack_timeout_us = 5'000'000;  // discovery_ack_timeout
    bool withdraw = true;                 // discovery_withdraw
    uint64_t live_after_us = 4'000'000;   // pushes start this long after start()
  };
  using Dispatch = std::function<void(const std::vector<Command>&)>;
  Discovery(EventLoop& loop, Options opts, Scheduler& sched, const Allocator& alloc,
            const Broker& broker, Dispatch dispatch);

  // The leader's term begins: versions go on from the wall clock; agents keep their
  // copies until every machine had the chance to report (live_after).
  void start();
  // An agent that answers DNS: the table now (once live) and every change after, of
  // every job (`everything`) or of the jobs it asked for (`jobs`, then interest());
  // its acknowledgements hold back the stops of those jobs' tasks.
  void subscribe(MachineId m, rpc::Session* s, bool everything = true,
                 const std::vector<std::string>& jobs = {});
  // service.interest from agent m on session `s`: it answers for these jobs from now on
  // (its DNS clients asked for them). The answer is their endpoints now, as an update
  // ("services": each job, null when there is none); their changes follow in the pushes.
  Result<nlohmann::json> interest(MachineId m, const rpc::Session* s, const nlohmann::json& params);
  // Where machine m's tasks are reached; its jobs' endpoints change with it.
  void set_address(MachineId m, const std::string& address);
  // The commands to send now of `cmds`: stops of tasks that just left discovery are held
  // until every agent has the new set (and the drain passed), then dispatched.
  std::vector<Command> refresh(const std::vector<Command>& cmds);

  // A region (region_services.h): this shard's own services, and the other shards',
  // which its agents then answer for too (replacing those given before).
  std::map<std::string, Service> local() const;
  void set_foreign(std::map<std::string, Service> others);

  // The service.* methods.
  // `params`: optional "local" (true: this shard's own jobs, not the region's others').
  Result<nlohmann::json> ls(const nlohmann::json& params) const;
  Result<nlohmann::json> show(const nlohmann::json& p) const;
  Result<nlohmann::json> watch(const nlohmann::json& p, const rpc::CallContext& c) {
    return watches_.watch(p, c);
  }
  void write_metrics(metrics::Writer& w) const;

 private:
  void send_snapshot(MachineId m, rpc::Session* s);
  size_t behind() const;  // agents that have not acknowledged what was sent to them
  void on_ack(MachineId m, const Result<nlohmann::json>& r);
  void recompute();
  void push();
  void push_soon(uint64_t now);  // at the end of this iteration, at most every 20 ms
  void arm_sync(uint64_t now);   // an acknowledged push within a second of a notified one
  void release_stops();
  void arm_timer();
  void note_timed_out(const std::vector<std::string>& tasks);
  std::string name(MachineId m) const { return alloc_.spec(m).name; }

  EventLoop& loop_;
  Options opts_;
  Scheduler& sched_;
  const Allocator& alloc_;
  const Broker& broker_;
  Dispatch dispatch_;
  ServiceTable table_;
  std::map<MachineId, rpc::Session*> sessions_;  // subscribed agents
  std::map<MachineId, std::string> addresses_;   // where each machine's tasks are
  std::set<std::string> dirty_;                  // jobs to look at again
  std::set<std::string> foreign_;                // other shards' jobs in table_
  // Tasks that left their job's endpoints: the version that withdrew them, the job's
  // drain, when (monotonic). A stop of one waits until the agents have that version.
  struct Left {
    std::string job;
    uint64_t version = 0, drain_us = 0, at_us = 0;
  };
  std::unordered_map<std::string, Left> left_;
  uint64_t pushed_ = 0, last_push_us_ = 0, ack_timeouts_ = 0;
  bool live_ = false;
  ServiceWatches watches_{loop_, table_};  // service.watch
  // push at the end of this loop iteration (or a bit later); recompute likewise; the
  // held stops' deadline; going live.
  Source push_soon_, recompute_soon_, timer_, live_timer_, sync_;
  bool withdrawn_ = false;           // an endpoint left since the last acknowledged push
  uint64_t last_acked_push_us_ = 0;  // monotonic
};

}  // namespace weft::cp
