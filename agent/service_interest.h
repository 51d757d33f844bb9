// The jobs this agent answers DNS for (docs/services.md "Interest"). The control plane
// tells an agent only of the jobs its DNS clients asked for: a query for a job the agent
// has not asked about waits while the agent asks (service.interest, one call for every
// name asked in the same loop iteration); the answer brings the job's endpoints, and its
// changes follow in the pushes. The names asked are kept and given again when the agent
// registers, so a new control plane tells it of the same jobs.
//
// A name no client asked for in `forget_after` is forgotten (its endpoints dropped from
// the copy, the control plane told in the next service.interest), and at `max_jobs` the
// least recently asked name makes room for a new one: the list follows what the clients
// ask now, like a cache, rather than growing with every name ever asked.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/result.h"
#include "common/services.h"

namespace weft::agent {

class ServiceInterest {
 public:
  static constexpr size_t kMaxJobs = 4096;  // the control plane's bound too
  struct Options {
    size_t max_jobs = kMaxJobs;
    uint64_t forget_after_us = 15ull * 60 * 1'000'000;  // not asked for this long
    uint64_t sweep_us = 60ull * 1'000'000;              // how often that is looked at
  };
  using Reply = std::function<void(Result<nlohmann::json>)>;
  // Sends service.interest for `jobs` and, first, `forget`; false when there is no
  // control plane to ask.
  using Ask = std::function<bool(const std::vector<std::string>& jobs,
                                 const std::vector<std::string>& forget, Reply reply)>;
  // `answered` is told each time an answer (or its failure) ends some waits.
  ServiceInterest(EventLoop& loop, ServiceCatalog& catalog, Ask ask, std::function<void()> answered,
                  Options opts);
  ServiceInterest(EventLoop& loop, ServiceCatalog& catalog, Ask ask, std::function<void()> answered)
      : ServiceInterest(loop, catalog, std::move(ask), std::move(answered), Options()) {}

  // A DNS query names `job` (lower case): true while its answer must wait for the
  // control plane (asked now or before, not yet answered); false: answer from the copy.
  bool must_wait(const std::string& job);
  // Every job asked for (registration's discovery_interest).
  std::vector<std::string> jobs() const;
  size_t size() const { return asked_.size(); }
  size_t waiting() const { return waiting_.size(); }
  uint64_t forgotten() const { return forgotten_; }
  // A push from the control plane, less the jobs this agent does not answer for (one it
  // forgot may still be in a push sent before the control plane heard); whole from a
  // control plane that refused service.interest (one from before it, which pushes
  // every job).
  void filter(ServiceUpdate& u) const;
  // Forgets the names not asked for in forget_after (the sweep's timer calls it).
  void sweep();

 private:
  void schedule_flush();
  void flush();
  // By value: the caller's name may be the key this erases.
  void forget(std::string job);
  void on_reply(const std::vector<std::string>& jobs, Result<nlohmann::json> r);
  EventLoop& loop_;
  ServiceCatalog& catalog_;
  Ask ask_;
  std::function<void()> answered_;
  const Options opts_;
  std::map<std::string, uint64_t> asked_;  // asked (lower case) -> last asked (monotonic)
  std::set<std::string> waiting_;          // asked, not yet answered
  std::vector<std::string> to_ask_, to_forget_;
  uint64_t forgotten_ = 0;
  bool everything_pushed_ = false;  // the control plane does not know service.interest
  Source flush_, sweep_;
};

}  // namespace weft::agent
