#include "controlplane/jobs/job_events.h"

#include <algorithm>
#include <cstdlib>

#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;

void JobEvents::record(const std::string& job, Event e) {
  e.seq = ++seq_;
  auto& q = jobs_[job];
  q.push_back(std::move(e));
  while (q.size() > kPerJob) q.pop_front();
  if (saved_[job].unsaved++ == 0) dirty_.push_back(job);
}

std::string JobEvents::note_key(const std::string& job, uint64_t first_seq) {
  std::string n = std::to_string(first_seq);
  return kNotePrefix + job + "/" + std::string(20 - std::min<size_t>(20, n.size()), '0') + n;
}

void JobEvents::forget_notes(const std::string& job, Notes& notes) {
  auto it = saved_.find(job);
  if (it == saved_.end()) return;
  for (const auto& [first, n] : it->second.notes) notes.erase(note_key(job, first));
  saved_.erase(it);
}

void JobEvents::save(Notes& notes, size_t max_jobs) {
  for (size_t done = 0; done < max_jobs && !dirty_.empty(); ++done) {
    const std::string job = std::move(dirty_.front());
    dirty_.pop_front();
    save_one(job, notes);
  }
}

void JobEvents::save_jobs(const std::set<std::string>& jobs, Notes& notes) {
  for (const auto& job : jobs) save_one(job, notes);  // (still in dirty_: skipped there)
}

void JobEvents::save_one(const std::string& job, Notes& notes) {
  auto it = saved_.find(job);
  if (it == saved_.end() || it->second.unsaved == 0) return;  // saved, or forgotten
  Saved& sv = it->second;
  auto q = jobs_.find(job);
  if (q == jobs_.end() || q->second.empty()) {
    sv.unsaved = 0;
    return;
  }
  const std::deque<Event>& events = q->second;
  auto array_of = [&events](size_t from) {
    json a = json::array();
    for (size_t i = from; i < events.size(); ++i) a.push_back(to_json(events[i]));
    return a;
  };
  if (sv.notes.size() >= kMaxNotes) {
    // Written again as one note: all the events kept, under the first one's number.
    const uint64_t first = events.front().seq;
    for (const auto& [f, n] : sv.notes)
      if (f != first) notes.erase(note_key(job, f));
    notes.put(note_key(job, first), array_of(0));
    sv.notes = {{first, events.size()}};
  } else {
    const size_t n = std::min(sv.unsaved, events.size());
    const size_t from = events.size() - n;
    notes.put(note_key(job, events[from].seq), array_of(from));
    sv.notes.emplace_back(events[from].seq, n);
  }
  sv.unsaved = 0;
  // The oldest notes go once the newer ones hold kPerJob events without them.
  size_t held = 0;
  for (const auto& [f, n] : sv.notes) held += n;
  while (sv.notes.size() > 1 && held - sv.notes.front().second >= kPerJob) {
    held -= sv.notes.front().second;
    notes.erase(note_key(job, sv.notes.front().first));
    sv.notes.pop_front();
  }
}

void JobEvents::restore(const std::map<std::string, json>& notes, Notes& out) {
  const std::string prefix = kNotePrefix;
  for (const auto& [key, value] : notes) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t slash = key.rfind('/');
    const std::string job = key.substr(prefix.size(), slash - prefix.size());
    const std::string first = key.substr(slash + 1);
    if (slash <= prefix.size() || first.size() != 20 || !value.is_array() || value.empty()) {
      log_warn("a job events note is not readable: dropped", {{"KEY", key}});
      out.erase(key);
      continue;
    }
    std::deque<Event>& q = jobs_[job];
    uint64_t last = q.empty() ? 0 : q.back().seq;
    size_t n = 0;
    for (const auto& j : value) {
      auto seq = j.is_object() ? j.find("seq") : j.end();
      if (!j.is_object() || seq == j.end() || !seq->is_number_unsigned() ||
          seq->get<uint64_t>() <= last) {
        log_warn("a job event in a note is not readable: left out", {{"KEY", key}});
        continue;
      }
      auto text = [&j](const char* name) {
        auto it = j.find(name);
        return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
      };
      Event e;
      e.seq = last = seq->get<uint64_t>();
      if (auto at = j.find("at_us"); at != j.end() && at->is_number_unsigned())
        e.at_us = at->get<uint64_t>();
      e.task = text("task");
      e.machine = text("machine");
      e.what = text("what");
      e.detail = text("detail");
      q.push_back(std::move(e));
      ++n;
      seq_ = std::max(seq_, last);
    }
    while (q.size() > kPerJob) q.pop_front();
    if (n)
      saved_[job].notes.emplace_back(std::strtoull(first.c_str(), nullptr, 10), n);
    else
      out.erase(key);
  }
  std::erase_if(jobs_, [](const auto& j) { return j.second.empty(); });
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
