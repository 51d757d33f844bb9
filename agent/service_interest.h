// The jobs this agent answers DNS for (docs/services.md "Interest"). The control plane
// tells an agent only of the jobs its DNS clients asked for: a query for a job the agent
// has not asked about waits while the agent asks (service.interest, one call for every
// name asked in the same loop iteration); the answer brings the job's endpoints, and its
// changes follow in the pushes. The names asked are kept (at most kMaxJobs) and given
// again when the agent registers, so a new control plane tells it of the same jobs.
#pragma once

#include <cstdint>
#include <functional>
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
  using Reply = std::function<void(Result<nlohmann::json>)>;
  // Sends service.interest for these jobs; false when there is no control plane to ask.
  using Ask = std::function<bool(const std::vector<std::string>& jobs, Reply reply)>;
  // `answered` is told each time an answer (or its failure) ends some waits.
  ServiceInterest(EventLoop& loop, ServiceCatalog& catalog, Ask ask,
                  std::function<void()> answered);

  // A DNS query names `job` (lower case): true while its answer must wait for the
  // control plane (asked now or before, not yet answered); false: answer from the copy.
  bool must_wait(const std::string& job);
  // Every job asked for (registration's discovery_interest).
  std::vector<std::string> jobs() const { return {jobs_.begin(), jobs_.end()}; }
  size_t waiting() const { return waiting_.size(); }

 private:
  void flush();
  void on_reply(const std::vector<std::string>& jobs, Result<nlohmann::json> r);
  EventLoop& loop_;
  ServiceCatalog& catalog_;
  Ask ask_;
  std::function<void()> answered_;
  std::set<std::string> jobs_;     // asked (lower case)
  std::set<std::string> waiting_;  // asked, not yet answered
  std::vector<std::string> to_ask_;
  Source flush_;
};

}  // namespace weft::agent
