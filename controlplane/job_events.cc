#include "controlplane/job_events.h"

#include <algorithm>

namespace weft::cp {

void JobEvents::record(const std::string& job, Event e) {
  e.seq = ++seq_;
  auto& q = jobs_[job];
  q.push_back(std::move(e));
  while (q.size() > kPerJob) q.pop_front();
}

std::vector<JobEvents::Event> JobEvents::list(const std::string& job, uint64_t after, size_t limit,
                                              uint64_t* next) const {
  std::vector<Event> out;
  *next = after;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  const auto& q = it->second;
  auto from = std::upper_bound(q.begin(), q.end(), after,
                               [](uint64_t s, const Event& e) { return s < e.seq; });
  for (; from != q.end() && out.size() < limit; ++from) out.push_back(*from);
  if (!out.empty()) *next = out.back().seq;
  return out;
}

nlohmann::json JobEvents::to_json(const Event& e) {
  nlohmann::json j{{"seq", e.seq},
                   {"at_us", e.at_us},
                   {"task", e.task},
                   {"machine", e.machine},
                   {"what", e.what}};
  if (!e.detail.empty()) j["detail"] = e.detail;
  return j;
}

}  // namespace weft::cp
