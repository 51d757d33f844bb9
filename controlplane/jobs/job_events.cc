#include "controlplane/jobs/job_events.h"

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

nlohmann::json JobEvents::latest(size_t n) const {
  std::vector<std::pair<const std::string*, const Event*>> all;
  for (const auto& [job, q] : jobs_) {
    size_t from = q.size() > n ? q.size() - n : 0;
    for (size_t i = from; i < q.size(); ++i) all.emplace_back(&job, &q[i]);
  }
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.second->seq > b.second->seq; });
  if (all.size() > n) all.resize(n);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [job, e] : all) {
    nlohmann::json j = to_json(*e);
    j["job"] = *job;
    out.push_back(std::move(j));
  }
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
